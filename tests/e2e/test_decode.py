"""`pretokenize decode`: shards back to text, with and without markers, across shard boundaries."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import unicodedata

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import REPO, SAMPLE_PARQUET, bucketed_sample

from pipelines import cli, decode
from shards import layout, llmc
from transforms.core.records import BadInputError
from transforms.scaffold.encode import countdown_tokens
from transforms.tokenizers.load import load_encoder

SAMPLE = pq.read_table(SAMPLE_PARQUET, columns=["id", "text"])
DOCS = [
    ["Toda", "a", "pessoa", "tem", "direito", "à", "educação", "."],
    ["Ninguém", "será", "arbitrariamente", "preso", "."],
    ["A", "família", "é", "o", "elemento", "natural", "e", "fundamental", "da", "sociedade", "."],
]


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory, gpt2_spec):
    """A val/ split of DOCS cut into shards of 9 tokens, as the job cuts them."""
    encoder = load_encoder(gpt2_spec)
    stream = np.concatenate([countdown_tokens(encoder.encode_batch(words)) for words in DOCS])
    d = tmp_path_factory.mktemp("decode") / "val"
    d.mkdir()
    for i, start in enumerate(range(0, len(stream), 9)):
        part = stream[start:start + 9]
        (d / f"shard_{i:03d}.bin").write_bytes(llmc.make_header(len(part)) + part.astype("<u2").tobytes())
    return d, stream


def run_decode(paths, gpt2_spec, docs=None, markers=False) -> tuple[list[str], str]:
    out, log = io.StringIO(), io.StringIO()
    decode.decode([str(p) for p in paths], decode.load_token_bytes(gpt2_spec), docs, markers, out, log)
    text = out.getvalue()
    return (text[:-1].split("\n\n") if text else []), log.getvalue()


def test_a_split_directory_decodes_to_the_words(split_dir, gpt2_spec):
    d, _ = split_dir
    docs, log = run_decode([d], gpt2_spec)
    assert docs == [" ".join(words) for words in DOCS] and log == ""
    docs, _ = run_decode([d], gpt2_spec, markers=True)
    assert docs[1] == "<ff_4> Ninguém <ff_3> será <ff_2> arbitrariamente <ff_1> preso <ff_0> ."
    assert run_decode([d], gpt2_spec, docs=2)[0] == [" ".join(words) for words in DOCS[:2]]
    assert run_decode([d], gpt2_spec, docs=0)[0] == []


def test_a_shard_from_the_middle_skips_a_partial_start_and_reads_on_at_its_end(split_dir, gpt2_spec):
    d, stream = split_dir
    first_doc_end = int(np.flatnonzero(stream == llmc.GPT2_EOT)[0])
    index = first_doc_end // 9  # the shard where document 0 ends and document 1 begins
    assert first_doc_end % 9 != 8, "the fixture should cut inside a document"
    docs, log = run_decode([d / f"shard_{index:03d}.bin"], gpt2_spec, docs=1)
    # The tail of document 0 is skipped; document 1 is read on into the next shard(s) beside it.
    assert docs == [" ".join(DOCS[1])]
    assert f"skipped {first_doc_end % 9 + 1} tokens at the start of" in log


def test_consecutive_shards_given_by_name_are_one_stream(split_dir, gpt2_spec):
    d, _ = split_dir
    files = sorted(d.iterdir())
    assert len(files) >= 4
    docs, log = run_decode(files, gpt2_spec)
    assert docs == [" ".join(words) for words in DOCS] and log == ""


def test_document_words_handles_malformed_documents():
    words = decode.document_words(np.array([5, 6, llmc.FF_BASE + 1, 7, llmc.FF_BASE, llmc.GPT2_EOT]))
    assert [(w.countdown, w.ids.tolist()) for w in words] == [(None, [5, 6]), (1, [7]), (0, [])]


def test_the_cli_prints_documents(split_dir, gpt2_spec, capsys, monkeypatch):
    d, _ = split_dir
    assert cli.main(["decode", str(d), "--docs", "1", "--markers", "--tokenizer", gpt2_spec]) == 0
    out = capsys.readouterr().out
    assert out == "<ff_7> Toda <ff_6> a <ff_5> pessoa <ff_4> tem <ff_3> direito <ff_2> à <ff_1> educação <ff_0> .\n"


def test_a_missing_path_is_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="no such file or directory"):
        decode.expand_paths([str(tmp_path / "nope")])
    with pytest.raises(BadInputError, match="without shard_NNN.bin"):
        decode.expand_paths([str(tmp_path)])
    with pytest.raises(ValueError, match="GPT-2 tokenizer"):
        decode.load_token_bytes("jet-nemotron")


# --------------------------------------------------------------------------------------------
# A bucketed tree: decoded with its own tokenizer (from its stats), by position and by id.


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    return bucketed_sample(tmp_path_factory.mktemp("decode_tree") / "out", "--partitions", "4",
                           "--max-shard-bytes", "120000")


def tree_printout(capsys, *args):
    code = cli.main(["decode", *map(str, args)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def printed_documents(out):
    """[(id, text)] of decode's printout: each document after its ``==> ID <==`` line."""
    parts = re.split(r"^==> (.*) <==\n", out, flags=re.M)
    assert parts[0] == ""
    return [(doc_id, text[:-1]) for doc_id, text in zip(parts[1::2], parts[2::2], strict=True)]


def storage_order(root):
    """The tree's document ids in storage order, from its manifest alone: bucket, partition, file, row."""
    rows = [line.split(" | ") for line in (root / layout.MANIFEST_NAME).read_text().splitlines()[1:]]
    return [doc_id for _, doc_id, _ in sorted(rows, key=lambda r: (layout.BUCKET_NAMES.index(r[0].split("/")[0]),
                                                                  r[0]))]


def test_a_bucketed_tree_decodes_by_position_to_its_source_texts(sample_tree, capsys):
    texts = dict(zip(SAMPLE.column("id").to_pylist(), SAMPLE.column("text").to_pylist(), strict=True))
    got = printed_documents(tree_printout(capsys, sample_tree, "--docs", "5"))
    order = storage_order(sample_tree)
    assert [doc_id for doc_id, _ in got] == order[:5]
    for doc_id, text in got:
        assert text == unicodedata.normalize("NFC", texts[doc_id])  # jet-nemotron encodes NFC text
    every = printed_documents(tree_printout(capsys, sample_tree))
    assert [doc_id for doc_id, _ in every] == order and every[:5] == got
    assert tree_printout(capsys, sample_tree, "--docs", "0") == ""


def test_a_bucketed_tree_decodes_one_document_by_id(sample_tree, capsys):
    texts = dict(zip(SAMPLE.column("id").to_pylist(), SAMPLE.column("text").to_pylist(), strict=True))
    doc_id = storage_order(sample_tree)[-1]  # the last stored, in the longest bucket
    assert printed_documents(tree_printout(capsys, sample_tree, "--id", doc_id)) == [
        (doc_id, unicodedata.normalize("NFC", texts[doc_id]))]
    assert cli.main(["decode", str(sample_tree), "--id", "no-such-id"]) == 2
    assert f"{sample_tree}: holds no document with id 'no-such-id'" in capsys.readouterr().err


def test_a_bucketed_tree_decodes_offline_with_the_tokenizer_its_stats_name(sample_tree, tmp_path):
    """In a fresh interpreter with no network and no Hugging Face hub: the bundled ranks alone."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    first = storage_order(sample_tree)[0]
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "decode", str(sample_tree), "--id", first],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"==> {first} <==\n")
    assert "jet-nemotron" in (sample_tree / layout.STATS_NAME).read_text()


def test_decoding_a_tree_refuses_what_it_cannot_do(sample_tree, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(sample_tree, unfinished)
    (unfinished / layout.STATS_NAME).unlink()
    assert cli.main(["decode", str(unfinished)]) == 2
    assert "no dataset_stats.txt" in capsys.readouterr().err
    assert cli.main(["decode", str(sample_tree), "--tokenizer", "gpt2"]) == 2
    assert "was written with EOS 151643, but the tokenizer 'gpt2' has EOS 50256" in capsys.readouterr().err
    assert cli.main(["decode", str(sample_tree), "--docs", "1", "--id", "x"]) == 2
    assert "give --docs N or --id ID, not both" in capsys.readouterr().err
