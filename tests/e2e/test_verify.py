"""pretokenize verify: a good tree passes; each kind of damage is caught and named."""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest
from conftest import finepdfs_row

from pipelines import bucketed, cli, verify
from shards import layout, manifest
from shards import tree as ownership

RUNNER = ["--runner=FnApiRunner"]
EOS = 151643
ROWS = [finepdfs_row(f"v-{i:02d}", f"Verification sample {i}, with some words. " * (4 + i % 7)) for i in range(24)]
ROWS.append(finepdfs_row("v-long", "A longer document for the second bucket. " * 150))


@pytest.fixture(scope="module")
def tree(source, bucketed_tree):
    return source, bucketed_tree


@pytest.fixture
def damaged(source, tree_copy):
    return source, tree_copy


def rows(out) -> list[tuple[str, str, int]]:
    with open(os.path.join(out, layout.MANIFEST_NAME), encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def write_rows(out, new_rows) -> None:
    with open(os.path.join(out, layout.MANIFEST_NAME), "w", encoding="utf-8") as f:
        f.write(manifest.MANIFEST_HEADER + "\n")
        f.writelines(manifest.format_row(*r) for r in new_rows)


def first_file(out) -> str:
    return next(r[0] for r in rows(out) if r[0].startswith("1024/"))


def run_verify(out, capsys, *flags) -> tuple[int, str]:
    code = verify.run(["--output", str(out), *flags, *RUNNER])
    return code, capsys.readouterr().out


def test_a_good_tree_passes_with_and_without_its_source(tree, capsys):
    src, out = tree
    code, text = run_verify(out, capsys)
    assert code == 0 and text.strip().splitlines()[-1].startswith("verify: OK")
    code, text = run_verify(out, capsys, "--input", str(src))
    assert code == 0 and "source compared on all ids" in text
    code, text = run_verify(out, capsys, "--input", str(src), "--sample", "0.3")
    assert code == 0 and "30% of ids" in text
    assert not (out / layout.TEMP_DIR_NAME).exists()


class _SwallowingResult:
    """A runner's result that turns Ctrl-C into its own error, as a portable runner may."""

    cancelled = False

    def wait_until_finish(self):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise RuntimeError("KeyboardInterrupt [while running 'VerifyOutput']") from None

    def cancel(self):
        self.cancelled = True


def test_ctrl_c_is_one_line_and_cancels_the_verify_job_even_when_the_runner_swallowed_it(tree, capsys, monkeypatch):
    """verify waits in the run loop every pipeline command shares (pipelines.job.stopping, wait_for)."""
    import apache_beam as beam

    _, out = tree
    result = _SwallowingResult()
    monkeypatch.setattr(beam.Pipeline, "run", lambda self, *a, **k: result)
    code = cli.main(["verify", "--output", str(out), *RUNNER])
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pretokenize verify:")]
    assert code == 2 and said == ["pretokenize verify: interrupted; the tree was not changed (verify writes nothing "
                                  "there)"]
    assert result.cancelled


def test_flipped_token_is_caught_by_the_checksums_and_against_the_source(damaged, capsys):
    src, out = damaged
    path = out / first_file(out)
    data = np.fromfile(path, dtype="<u4")
    data[1] = data[1] + 1 if data[1] + 1 != EOS else data[1] + 2
    data.tofile(path)
    code, text = run_verify(out, capsys)
    assert code == 1 and f"{first_file(out)}: content differs from its sha256 in checksums.sha256" in text
    code, text = run_verify(out, capsys, "--input", str(src))
    assert code == 1 and "stored tokens differ from the re-tokenized input at token 1" in text
    assert "verify: FAILED, 2 problems" in text


def test_truncated_file_is_caught(damaged, capsys):
    _, out = damaged
    rel = first_file(out)
    path = out / rel
    path.write_bytes(path.read_bytes()[:-6])
    code, text = run_verify(out, capsys)
    assert code == 1
    assert f"{rel}: size" in text and "is not a multiple of 4" in text
    assert "the file ends after" in text


def test_missing_file_is_caught(damaged, capsys):
    _, out = damaged
    rel = first_file(out)
    (out / rel).unlink()
    code, text = run_verify(out, capsys)
    assert code == 1 and f"{rel}: listed in the manifest but missing" in text


def test_extra_manifest_row_is_caught(damaged, capsys):
    _, out = damaged
    r = rows(out)
    rel = first_file(out)
    i = max(k for k, row in enumerate(r) if row[0] == rel)
    write_rows(out, r[: i + 1] + [(rel, "ghost-document", 12)] + r[i + 1:])
    code, text = run_verify(out, capsys)
    assert code == 1 and "its manifest rows count" in text and "ghost-document" in text


def test_wrong_bucket_is_caught(damaged, capsys):
    _, out = damaged
    rel = first_file(out)
    moved = rel.replace("1024/", "4096/")
    os.makedirs(out / "4096", exist_ok=True)
    os.rename(out / rel, out / moved)
    write_rows(out, [(moved if a == rel else a, b, c) for a, b, c in rows(out)])
    code, text = run_verify(out, capsys)
    assert code == 1 and "do not belong in bucket 4096" in text


def test_eos_inside_a_document_is_caught(damaged, capsys):
    _, out = damaged
    path = out / first_file(out)
    data = np.fromfile(path, dtype="<u4")
    data[2] = EOS
    data.tofile(path)
    code, text = run_verify(out, capsys)
    assert code == 1 and "EOS inside the document at token 2" in text


def test_file_without_rows_and_stale_stats_are_caught(damaged, capsys):
    _, out = damaged
    (out / "1024" / "p01_00007.npy").write_bytes(np.array([5, EOS], dtype="<u4").tobytes())
    record = ownership.read_record(str(out))
    ownership.record_files(str(out), record, add=["1024/p01_00007.npy"])  # the tool's own, by its record
    stats = (out / layout.STATS_NAME).read_text()
    (out / layout.STATS_NAME).write_text(stats.replace("raw_documents: 25", "raw_documents: 26"))
    code, text = run_verify(out, capsys)
    assert code == 1
    assert "1024/p01_00007.npy: file without manifest rows" in text
    assert "26 read but 25 kept + 0 dropped" in text


def test_unfinished_tree_fails_without_running(damaged, capsys):
    _, out = damaged
    (out / layout.STATS_NAME).unlink()
    code, text = run_verify(out, capsys)
    assert code == 1 and "the tree is not finished" in text


@pytest.fixture(scope="module")
def scaffold_tree(tmp_path_factory, gpt2_spec):
    from conftest import REPO

    from pipelines import scaffold

    out = tmp_path_factory.mktemp("vscaffold") / "out"
    scaffold.run(["--input", str(REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"), "--output", str(out),
                  "--tokenizer", gpt2_spec, "--shard-tokens", "4000", *RUNNER])
    return out


@pytest.fixture
def scaffold_copy(scaffold_tree, tmp_path):
    copy = tmp_path / "scaffold"
    shutil.copytree(scaffold_tree, copy)
    return copy


def scaffold_tokens(shard) -> tuple[bytes, np.ndarray]:
    from shards import llmc

    data = shard.read_bytes()
    return data[: llmc.HEADER_BYTES], np.frombuffer(data[llmc.HEADER_BYTES:], dtype="<u2").copy()


def test_verify_checks_a_scaffold_tree_too(scaffold_copy, capsys):
    out = scaffold_copy
    code, text = run_verify(out, capsys)
    assert code == 0 and "verify: OK" in text and "scaffold" in text
    shard = out / "train" / "shard_000.bin"
    header, tokens = scaffold_tokens(shard)
    tokens[0] = 100  # the first document no longer starts with a countdown token
    shard.write_bytes(header + tokens.tobytes())
    code, text = run_verify(out, capsys)
    assert code == 1 and "verify: FAILED" in text and "countdown" in text


def test_the_scaffold_job_writes_a_sha256sum_file_of_its_shards(scaffold_tree):
    import hashlib

    lines = (scaffold_tree / layout.CHECKSUMS_NAME).read_text().splitlines()
    shards = sorted(f"{s}/{p.name}" for s in ("train", "val") for p in (scaffold_tree / s).iterdir())
    assert len(shards) >= 3
    assert lines == [f"{hashlib.sha256((scaffold_tree / rel).read_bytes()).hexdigest()}  {rel}" for rel in shards]


def test_a_flipped_bpe_token_in_a_scaffold_shard_is_caught_by_its_checksum(scaffold_copy, capsys):
    from shards import llmc

    shard = scaffold_copy / "train" / "shard_001.bin"
    header, tokens = scaffold_tokens(shard)
    at = int(np.flatnonzero(tokens < llmc.GPT2_EOT - 1)[5])
    tokens[at] += 1  # another BPE id: every format check still passes
    shard.write_bytes(header + tokens.tobytes())
    assert llmc.check_llmc_split([str(p) for p in sorted((scaffold_copy / "train").iterdir())]) == []
    code, text = run_verify(scaffold_copy, capsys)
    assert code == 1, text
    assert "train/shard_001.bin: content differs from its sha256 in checksums.sha256" in text
    assert "verify: FAILED, 1 problem in" in text


def test_scaffold_checksums_must_list_every_shard_and_only_shards(scaffold_copy, capsys):
    sums = scaffold_copy / layout.CHECKSUMS_NAME
    lines = sums.read_text().splitlines()
    dropped = lines.pop(0).split("  ", 1)[1]
    sums.write_text("\n".join(lines + ["0" * 64 + "  val/shard_009.bin"]) + "\n")
    code, text = run_verify(scaffold_copy, capsys)
    assert code == 1
    assert f"{dropped}: not listed in checksums.sha256" in text
    assert "checksums.sha256 names val/shard_009.bin, which is not in the tree" in text


def test_a_missing_checksum_file_is_a_problem_in_both_kinds_of_tree(damaged, scaffold_copy, capsys):
    _, out = damaged
    # Without the checksums a flipped token would pass: the file is required.
    path = out / first_file(out)
    data = np.fromfile(path, dtype="<u4")
    data[1] = data[1] + 1 if data[1] + 1 != EOS else data[1] + 2
    data.tofile(path)
    for tree in (out, scaffold_copy):
        (tree / layout.CHECKSUMS_NAME).unlink()
        code, text = run_verify(tree, capsys)
        assert code == 1, text
        assert "checksums.sha256: missing: the shards' contents cannot be checked" in text


BAD_LINES = [
    json.dumps(finepdfs_row("v-null", None)),  # a null text: null_field
    '{"id": "v-broken", "text": "cut off',  # not JSON: invalid_json
    json.dumps(finepdfs_row("v|pipe", "An id the manifest cannot hold. " * 5)),  # bad_id
]


def test_a_tree_written_with_on_bad_record_skip_verifies_against_its_source(tmp_path, capsys):
    good = [json.dumps(r) for r in ROWS[:8]]
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join(good[:3] + BAD_LINES + good[3:]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = bucketed.run(["--input", str(src), "--output", str(out), "--partitions", "2",
                          "--on-bad-record", "skip", *RUNNER])
    assert stats.drops == {"null_field": 1, "invalid_json": 1, "bad_id": 1}
    code, text = run_verify(out, capsys, "--input", str(src))
    assert code == 0, text
    assert "8 documents" in text

    # The stats must count what the input holds: one more null_field than there is is a problem.
    stats_path = out / layout.STATS_NAME
    original = stats_path.read_text()
    assert "raw_documents: 11" in original
    stats_path.write_text(original.replace("null_field | 1", "null_field | 2").replace("raw_documents: 11",
                                                                                       "raw_documents: 12"))
    code, text = run_verify(out, capsys, "--input", str(src))
    assert code == 1
    assert "dataset_stats.txt: 2 documents dropped as null_field, but the input holds 1 such bad records" in text
    assert "verify: FAILED, 1 problem in" in text

    # And a bad record the stats do not count (one more line that is not JSON) is one too.
    more = tmp_path / "more.jsonl"
    more.write_text(src.read_text() + "not json at all\n", encoding="utf-8")
    stats_path.write_text(original)
    code, text = run_verify(out, capsys, "--input", str(more))
    assert code == 1
    assert "dataset_stats.txt: 1 documents dropped as invalid_json, but the input holds 2 such bad records" in text


def test_an_input_with_a_repeated_id_verifies_against_the_copy_the_job_kept(tmp_path, capsys):
    rows = ROWS[:6] + [finepdfs_row("v-02", "A later copy of an id, with other text. " * 30)]
    src = tmp_path / "dup.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    bucketed.run(["--input", str(src), "--output", str(out), "--partitions", "2", *RUNNER])
    code, text = run_verify(out, capsys, "--input", str(src))
    assert code == 0, text
