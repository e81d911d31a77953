"""pretokenize verify: a good tree passes; each kind of damage is caught and named."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import finepdfs_row

from pipelines import bucketed, verify
from shards import layout, manifest

RUNNER = ["--runner=FnApiRunner"]
EOS = 151643
ROWS = [finepdfs_row(f"v-{i:02d}", f"Verification sample {i}, with some words. " * (4 + i % 7)) for i in range(24)]
ROWS.append(finepdfs_row("v-long", "A longer document for the second bucket. " * 150))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    src = tmp_path_factory.mktemp("vsrc") / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    out = tmp_path_factory.mktemp("vtree") / "out"
    bucketed.run(["--input", str(src), "--output", str(out), "--partitions", "2", *RUNNER])
    return src, out


@pytest.fixture
def damaged(tree, tmp_path):
    src, out = tree
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    return src, copy


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


def test_verify_checks_a_scaffold_tree_too(tmp_path, capsys, gpt2_spec):
    from conftest import REPO

    from pipelines import scaffold
    from shards import llmc

    out = tmp_path / "scaffold"
    scaffold.run(["--input", str(REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"), "--output", str(out),
                  "--tokenizer", gpt2_spec, "--shard-tokens", "4000", *RUNNER])
    code, text = run_verify(out, capsys)
    assert code == 0 and "verify: OK" in text and "scaffold" in text
    shard = out / "train" / "shard_000.bin"
    data = bytearray(shard.read_bytes())
    tokens = np.frombuffer(bytes(data[llmc.HEADER_BYTES:]), dtype="<u2").copy()
    tokens[0] = 100  # the first document no longer starts with a countdown token
    shard.write_bytes(bytes(data[: llmc.HEADER_BYTES]) + tokens.tobytes())
    code, text = run_verify(out, capsys)
    assert code == 1 and "verify: FAILED" in text and "countdown" in text


def test_an_input_with_a_repeated_id_verifies_against_the_copy_the_job_kept(tmp_path, capsys):
    rows = ROWS[:6] + [finepdfs_row("v-02", "A later copy of an id, with other text. " * 30)]
    src = tmp_path / "dup.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    bucketed.run(["--input", str(src), "--output", str(out), "--partitions", "2", *RUNNER])
    code, text = run_verify(out, capsys, "--input", str(src))
    assert code == 0, text
