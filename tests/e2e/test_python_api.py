"""The Python API (pipelines/api.py, docs/python-api.md): each job run from Python gives the bytes its
command gives; a bad argument raises the documented exception with the command's line; the page's
examples run as written from a directory laid out like the checkout's root."""

from __future__ import annotations

import io
import os
import re
import shutil

import pyarrow.parquet as pq
import pytest
from conftest import REPO, SAMPLE_PARQUET, tree_hashes

from pipelines import api, cli, decode, train_bpe
from shards.reader import open_tree

SCAFFOLD_INPUT = REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"
RUNNER = "FnApiRunner"
PAGE = REPO / "docs" / "python-api.md"


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The bucketed job on the sample, once by its command and once from Python."""
    root = tmp_path_factory.mktemp("api")
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(root / "cli"),
                     f"--runner={RUNNER}"]) == 0
    result = api.bucketed(input=str(SAMPLE_PARQUET), output=root / "api", runner=RUNNER)
    return root, result


def test_bucketed_from_python_writes_the_commands_bytes_and_returns_them(twins):
    root, result = twins
    assert tree_hashes(root / "api") == tree_hashes(root / "cli")
    stats = open_tree(str(root / "cli")).stats
    assert result.output == str(root / "api") and result.stats == open_tree(str(root / "api")).stats
    assert (result.documents, result.tokens, result.drops) == (stats.kept_documents, stats.total_tokens, stats.drops)
    assert set(result.files) == {rel for rel in tree_hashes(root / "api") if rel.endswith(".npy")}
    assert len(result.files) == stats.total_files


def test_verify_from_python_says_what_its_command_says(twins, capsys):
    root, _ = twins
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(root / "cli"), f"--runner={RUNNER}"]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    verdict = api.verify(root / "cli", runner=RUNNER)
    assert verdict.ok and verdict.problems == 0
    assert said == f"verify: OK, {root / 'cli'} ({verdict.checked})"


def test_remove_from_python_writes_the_commands_bytes(twins, tmp_path):
    root, _ = twins
    for name in ("cli", "api"):
        shutil.copytree(root / "cli", tmp_path / name)
    tree = open_tree(str(tmp_path / "cli"))
    listed = tmp_path / "list.txt"
    listed.write_text(f"{tree.info(0).id}\n{tree.info(len(tree) - 1).id}\nnot-an-id-of-the-sample\n")
    tokens = len(tree.document(0)) + len(tree.document(len(tree) - 1))
    assert cli.main(["remove", "--output", str(tmp_path / "cli"), "--removal-list", str(listed),
                     f"--runner={RUNNER}"]) == 0
    removed = api.remove(tmp_path / "api", listed, runner=RUNNER)
    audit = "removals.txt"  # names the run and its time
    assert tree_hashes(tmp_path / "api", skip=(audit,)) == tree_hashes(tmp_path / "cli", skip=(audit,))
    assert removed.removed_documents == 2 and removed.run is not None and 1 <= len(removed.files) <= 2
    assert removed.removed_tokens == tokens


def test_scaffold_and_decode_from_python_give_the_commands_bytes(tmp_path):
    flags = ["--tokenizer", "gpt2", "--shard-tokens", "4000"]
    assert cli.main(["scaffold", "--input", str(SCAFFOLD_INPUT), "--output", str(tmp_path / "cli"), *flags,
                     f"--runner={RUNNER}"]) == 0
    result = api.scaffold(input=str(SCAFFOLD_INPUT), output=str(tmp_path / "api"), tokenizer="gpt2",
                          shard_tokens=4000, runner=RUNNER)
    assert tree_hashes(tmp_path / "api") == tree_hashes(tmp_path / "cli")
    assert result.tokens == result.stats.total_tokens > 0 and result.files
    # decode of llm.c shards: what its command prints, from the documents the call returns
    out = io.StringIO()
    assert decode.write(api.decode([tmp_path / "api" / "train"], docs=2, markers=True), out) == 2
    printed = _printed(["decode", str(tmp_path / "cli" / "train"), "--docs", "2", "--markers"])
    assert out.getvalue() == printed and "<ff_" in printed


def _printed(argv: list[str]) -> str:
    """What ``pretokenize ARGV`` prints on stdout (it must succeed)."""
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    return out.getvalue()


def test_stats_from_python_writes_the_commands_bytes(twins, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the histogram needs matplotlib (the 'stats' extra)")
    root, _ = twins
    for name in ("cli", "api"):  # the same tree's name in both: the table and the picture say it
        shutil.copytree(root / "cli", tmp_path / name / "tree")
    assert cli.main(["stats", "--output", str(tmp_path / "cli" / "tree")]) == 0
    printed = capsys.readouterr().out
    written = api.stats(tmp_path / "api" / "tree")
    assert tree_hashes(tmp_path / "api") == tree_hashes(tmp_path / "cli")
    assert written.text in printed and written.png == str(tmp_path / "api" / "tree" / "length_histogram.png")
    assert written.summary["total"]["documents"] == open_tree(str(root / "cli")).stats.kept_documents
    with pytest.raises(api.UsageError) as e:
        api.stats(tmp_path / "nothing-here")
    assert cli.main(["stats", "--output", str(tmp_path / "nothing-here")]) == 2
    assert capsys.readouterr().err.strip() == f"pretokenize stats: {e.value}"


def test_export_from_python_writes_the_commands_bytes(twins, tmp_path, capsys):
    root, _ = twins
    for name in ("cli", "api"):
        shutil.copytree(root / "cli", tmp_path / name / "tree", symlinks=True)
    cli_tree, api_tree = tmp_path / "cli" / "tree", tmp_path / "api" / "tree"
    assert cli.main(["export", "megatron", "--output", str(cli_tree), "--mount", "/data/tree"]) == 0
    result = api.export(api_tree, mount="/data/tree")
    assert tree_hashes(tmp_path / "api") == tree_hashes(tmp_path / "cli")
    links = {rel for rel in tree_hashes(api_tree) if rel.endswith(".bin")}
    assert links and all(os.readlink(api_tree / rel) == os.readlink(cli_tree / rel) for rel in links)
    stats = open_tree(str(api_tree)).stats
    assert result.written and len(result.prefixes) == len(links) == stats.total_files
    assert (result.tokens, result.sequences) == (stats.total_tokens, stats.kept_documents)
    assert result.blends == (str(api_tree / "megatron" / "data_args.txt"),)
    assert api.export(api_tree, mount="/data/tree", check=True).problems == ()
    (api_tree / f"{result.prefixes[0]}.idx").unlink()
    (cli_tree / f"{result.prefixes[0]}.idx").unlink()
    checked = api.export(api_tree, mount="/data/tree", check=True)
    assert not checked.written and checked.problems == (f"{result.prefixes[0]}.idx: missing",)
    capsys.readouterr()
    assert cli.main(["export", "megatron", "--output", str(cli_tree), "--mount", "/data/tree", "--check"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == f"  {checked.problems[0]}"
    with pytest.raises(api.UsageError) as e:
        api.export(tmp_path / "nothing-here")
    assert cli.main(["export", "megatron", "--output", str(tmp_path / "nothing-here")]) == 2
    assert capsys.readouterr().err.strip() == f"pretokenize export: {e.value}"


def test_decode_from_python_gives_what_its_command_prints(twins, capsys):
    root, _ = twins
    printed = _printed(["decode", str(root / "cli"), "--docs", "3"])
    docs = api.decode(root / "cli", docs=3)
    out = io.StringIO()
    assert decode.write(docs, out) == 3 and out.getvalue() == printed
    texts = dict(zip(*pq.read_table(SAMPLE_PARQUET, columns=["id", "text"]).to_pydict().values(), strict=True))
    assert all(doc.text == texts[doc.id] for doc in docs)  # the sample's own text, id by id
    assert api.decode(str(root / "cli"), doc_id=docs[2].id) == [docs[2]]
    with pytest.raises(api.UsageError) as e:
        api.decode(root / "cli", docs=1, doc_id=docs[0].id)
    capsys.readouterr()
    assert cli.main(["decode", str(root / "cli"), "--docs", "1", "--id", docs[0].id]) == 2
    assert capsys.readouterr().err.strip() == f"pretokenize decode: {e.value}"
    with pytest.raises(api.UsageError, match="the following arguments are required: paths"):
        api.decode([])


def test_train_bpe_from_python_writes_the_bytes_of_its_command_line_twin(tmp_path, monkeypatch):
    """The tokenizer's files record the command line: the call records the one its keywords are
    twin to, and that command, run in a copy of the directory, writes the same bytes."""
    for name in ("api", "cli"):
        (tmp_path / name).mkdir()
        shutil.copyfile(SAMPLE_PARQUET, tmp_path / name / "sample.parquet")
    monkeypatch.chdir(tmp_path / "api")
    result = api.train_bpe(input="sample.parquet", output="tok", vocab_size=600, min_count=2, runner=RUNNER)
    assert result.argv == ("--input=sample.parquet", "--output=tok", "--vocab-size=600", "--min-count=2",
                           f"--runner={RUNNER}")
    monkeypatch.chdir(tmp_path / "cli")
    assert cli.main(["train-bpe", *result.argv]) == 0
    made = tree_hashes(tmp_path / "api" / "tok")
    assert made == tree_hashes(tmp_path / "cli" / "tok") and set(result.files) <= set(made)
    assert " ".join(result.argv) in (tmp_path / "api" / "tok" / "merges.txt").read_text().splitlines()[0]
    assert result.stats.eos_id == 599 and result.output == str(tmp_path / "api" / "tok")


def test_train_bpe_refuses_what_its_parser_refuses(capsys):
    with pytest.raises(api.UsageError) as e:
        api.train_bpe(input=str(SAMPLE_PARQUET), output="unused", vocab_size=600, merges=10)
    with pytest.raises(SystemExit):
        train_bpe.make_parser().parse_args(["--input", "x", "--output", "y", "--vocab-size", "600", "--merges", "10"])
    said = capsys.readouterr().err.strip().rsplit("error: ", 1)[1]  # argparse's words; the API adds what a
    assert str(e.value) == f"{said}; nothing was published"           # publishing job's usage error says
    with pytest.raises(api.UsageError, match="one of the arguments --vocab-size --merges is required"):
        api.train_bpe(input=str(SAMPLE_PARQUET), output="unused")


BAD = [
    ({"tokenizer": "gtp2"}, ["--tokenizer", "gtp2"], api.UsageError),
    ({"lid_threshold": 2.0}, ["--lid-threshold", "2.0"], api.UsageError),
    ({"partitions": 0}, ["--partitions", "0"], api.UsageError),
    ({"keep": ["is_truncated = false"]}, ["--keep", "is_truncated = false"], api.UsageError),
    ({"input": "tests/data/no-such-file.parquet"}, ["--input", "tests/data/no-such-file.parquet"],
     api.BadInputError),
    ({"beam_args": ["--direct_num_workerz=2"]}, ["--direct_num_workerz=2"], api.UsageError),
]


@pytest.mark.parametrize(("kwargs", "flags", "raised"), BAD, ids=[b[1][0] for b in BAD])
def test_a_bad_argument_raises_the_documented_error_with_the_commands_line(kwargs, flags, raised, tmp_path,
                                                                           capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    given = {"input": str(SAMPLE_PARQUET), "output": str(tmp_path / "out"), "runner": RUNNER, **kwargs}
    argv = ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"), f"--runner={RUNNER}",
            *flags]
    capsys.readouterr()
    assert cli.main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(raised) as e:
        api.bucketed(**given)
    assert isinstance(e.value, api.PretokenizeError) and e.value.job == "bucketed"
    assert f"pretokenize bucketed: {e.value}" == line
    assert not (tmp_path / "out").exists()


def test_a_keyword_no_flag_spells_is_refused_naming_the_closest():
    with pytest.raises(api.UsageError, match=r"unknown argument 'tokeniser' \(did you mean tokenizer\?\)"):
        api.bucketed(input=str(SAMPLE_PARQUET), output="unused", tokeniser="gpt2")
    with pytest.raises(api.UsageError, match="argument --dtype: invalid choice: 'uint8'"):
        api.bucketed(input=str(SAMPLE_PARQUET), output="unused", dtype="uint8")
    with pytest.raises(api.UsageError, match="argument --seed: invalid int value: '1'"):
        api.bucketed(input=str(SAMPLE_PARQUET), output="unused", seed="1")


def test_the_page_runs_as_written_from_the_checkouts_root(tmp_path, monkeypatch, capsys):
    text = PAGE.read_text(encoding="utf-8")
    assert text.startswith("# Python API\n")
    for source in (SAMPLE_PARQUET, SCAFFOLD_INPUT):
        target = tmp_path / source.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    monkeypatch.chdir(tmp_path)
    found = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    assert len(found) == 9
    for code in found:
        exec(compile(code, str(PAGE), "exec"), {})
    printed = capsys.readouterr().out
    assert "unknown tokenizer 'gtp2' (did you mean gpt2?)" in printed
    assert (tmp_path / "out" / "api-sample" / "dataset_stats.txt").exists()
    assert not (tmp_path / "out" / "api-bad").exists()
    assert (tmp_path / "out" / "api-sample" / "megatron" / "data_args.txt").exists()
    assert (tmp_path / "out" / "api-bpe" / "training_stats.txt").exists()
