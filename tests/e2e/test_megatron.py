"""`pretokenize export megatron`: the exported indexes are read back here by an independent reader
of Megatron-LM's .idx format, written from the format's description, and must give every document
of the manifest token for token, through the shard files themselves (no copy)."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct

import numpy as np
import pytest
from conftest import SAMPLE_PARQUET, import_trainer_module
from test_reader import doc_tokens, llmc_doc, manifest_view, write_bucketed_tree, write_llmc

from pipelines import bucketed, export, verify
from shards import layout, llmc, manifest, megatron
from shards import tree as ownership
from shards.reader import IncompleteTreeError, open_tree

# Megatron-LM's indexed dataset, as its format is described:
#   b"MMIDIDX\x00\x00" | uint64 version (1) | uint8 dtype code | uint64 sequence count S |
#   uint64 document-index count D | int32 lengths[S] | int64 byte pointers[S] | int64 document indices[D]
# little-endian; document d is made of sequences document_indices[d] .. document_indices[d + 1] - 1.
MEGATRON_DTYPES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}


def read_idx(path):
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:9] == b"MMIDIDX\x00\x00", "bad magic"
    (version,) = struct.unpack_from("<Q", raw, 9)
    (code,) = struct.unpack_from("<B", raw, 17)
    count, doc_count = struct.unpack_from("<QQ", raw, 18)
    assert version == 1
    at = 34
    lengths = np.frombuffer(raw, dtype="<i4", count=count, offset=at)
    at += 4 * count
    pointers = np.frombuffer(raw, dtype="<i8", count=count, offset=at)
    at += 8 * count
    doc_index = np.frombuffer(raw, dtype="<i8", count=doc_count, offset=at)
    at += 8 * doc_count
    assert at == len(raw), "trailing bytes after the document indices"
    return code, lengths, pointers, doc_index


def read_megatron_dataset(prefix):
    """Documents of PREFIX.bin as Megatron would see them, read through PREFIX.idx."""
    code, lengths, pointers, doc_index = read_idx(prefix + ".idx")
    dtype = np.dtype(MEGATRON_DTYPES[code])
    data = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")
    assert doc_index[0] == 0 and doc_index[-1] == len(lengths) and np.all(np.diff(doc_index) >= 0)
    docs = []
    for d in range(len(doc_index) - 1):
        seqs = [np.frombuffer(data, dtype=dtype, count=int(lengths[s]), offset=int(pointers[s]))
                for s in range(doc_index[d], doc_index[d + 1])]
        docs.append(np.concatenate(seqs))
    return code, docs


@pytest.fixture(scope="module")
def sample_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron") / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner",
                  "--partitions", "4", "--max-shard-bytes", "120000"])
    return out


@pytest.fixture
def tree_copy(sample_out, tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(sample_out, copy)
    return copy


def test_the_export_reads_back_token_for_token_through_the_shards(tree_copy, capsys):
    expected = manifest_view(tree_copy)
    sizes_before = {rel: os.path.getsize(tree_copy / rel) for rel in {r for _, r, _, _ in expected}}
    assert export.run(["megatron", "--output", str(tree_copy)]) == 0
    assert f"wrote {len({r for _, r, _, _ in expected})} Megatron indexes" in capsys.readouterr().out
    per_file = {}
    for _, rel, _, tokens in expected:
        per_file.setdefault(rel, []).append(tokens)
    for rel, docs in per_file.items():
        prefix = str(tree_copy / "megatron" / rel[: -len(".npy")])
        assert os.path.islink(prefix + ".bin") and os.path.samefile(prefix + ".bin", tree_copy / rel)
        code, read = read_megatron_dataset(prefix)
        assert code == 4  # int32: uint32 ids below 2**31 have the same bytes
        assert len(read) == len(docs)
        for got, want in zip(read, docs, strict=True):
            assert np.array_equal(got.astype(np.int64), want.astype(np.int64))
    # Not a token was rewritten: the shards are as they were, and the blend names each with its size.
    assert {rel: os.path.getsize(tree_copy / rel) for rel in sizes_before} == sizes_before
    blend = (tree_copy / "megatron" / "data_args.txt").read_text().split()
    weights, prefixes = [int(w) for w in blend[0::2]], blend[1::2]
    assert prefixes == ["megatron/" + rel[: -len(".npy")] for rel in per_file]  # relative to the tree's root
    assert weights == [sum(len(t) for t in per_file[rel]) for rel in per_file]


def test_check_finds_stale_and_orphaned_indexes_and_a_re_export_fixes_them(tree_copy, capsys):
    export.run(["megatron", "--output", str(tree_copy)])
    tree = open_tree(str(tree_copy))
    assert export.check_megatron(tree) == []
    # A surgical removal rewrites one shard without its first document; a re-run drops another shard.
    rows = manifest_view(tree_copy)
    files = [r for _, r, _, _ in rows]
    changed = next(r for r in files if files.count(r) > 1)
    gone = next(r for r in files if r.split("/")[0] != changed.split("/")[0])
    dropped = files.index(changed)  # the first document of the changed shard
    keep = [row for k, row in enumerate(rows) if k != dropped and row[1] != gone]
    np.concatenate([t for _, r, _, t in keep if r == changed]).astype("<u4").tofile(tree_copy / changed)
    os.remove(tree_copy / gone)
    with open(tree_copy / layout.MANIFEST_NAME, "w", encoding="utf-8") as f:
        f.write(manifest.MANIFEST_HEADER + "\n")
        f.writelines(manifest.format_row(r, i, len(t)) for i, r, _, t in keep)
    stats = manifest.DatasetStats.from_text((tree_copy / layout.STATS_NAME).read_text())
    for name, b in stats.buckets.items():
        b.documents = sum(1 for _, r, _, _ in keep if r.startswith(name + "/"))
        b.tokens = sum(len(t) for _, r, _, t in keep if r.startswith(name + "/"))
        b.files = len({r for _, r, _, _ in keep if r.startswith(name + "/")})
    stats.raw_documents = stats.kept_documents + stats.dropped_documents
    (tree_copy / layout.STATS_NAME).write_text(stats.to_text())

    problems = export.check_megatron(open_tree(str(tree_copy)))
    stem, gone_stem = "megatron/" + changed[: -len(".npy")], "megatron/" + gone[: -len(".npy")]
    assert f"{stem}.idx: stale (does not describe {changed} as it is now)" in problems
    assert f"{gone_stem}.idx: left from a shard that no longer exists" in problems
    assert f"{gone_stem}.bin: left from a shard that no longer exists" in problems
    assert ("megatron/data_args.txt: missing or stale (its prefixes, relative to the tree's root, are not the "
            "shards' now)") in problems
    assert len(problems) == 4
    assert export.run(["megatron", "--output", str(tree_copy), "--check"]) == 1
    assert "4 problem(s)" in capsys.readouterr().out

    export.run(["megatron", "--output", str(tree_copy)])
    assert export.check_megatron(open_tree(str(tree_copy))) == []
    assert not any(os.path.lexists(tree_copy / (gone_stem + ext)) for ext in (".idx", ".bin"))
    _, read = read_megatron_dataset(str(tree_copy / stem))
    assert [d.tolist() for d in read] == [t.tolist() for _, r, _, t in keep if r == changed]


def test_the_tree_itself_is_untouched_and_still_verifies(tree_copy):
    def tree_files():
        out = {}
        for dirpath, _, names in os.walk(tree_copy):
            for name in names:
                rel = os.path.relpath(os.path.join(dirpath, name), tree_copy)
                if not rel.startswith("megatron" + os.sep) and rel != ownership.RECORD_NAME:
                    out[rel] = hashlib.sha256((tree_copy / rel).read_bytes()).hexdigest()
        return out

    before = tree_files()
    export.run(["megatron", "--output", str(tree_copy)])
    assert tree_files() == before  # the record, which lists the export's files, is the one change
    assert verify.run(["--output", str(tree_copy), "--runner=FnApiRunner"]) == 0


def test_a_uint16_tree_is_exported_as_uint16(tmp_path):
    rng = np.random.default_rng(3)
    docs = [(f"d{i}", doc_tokens(rng, 10 + i, eos=50256, high=50000)) for i in range(5)]
    write_bucketed_tree(tmp_path, {"1024/p00_00000.npy": docs[:2], "1024/p01_00000.npy": docs[2:]},
                        eos=50256, dtype="uint16", vocab_size=50257)
    (tmp_path / ownership.RECORD_NAME).write_text(ownership.TreeRecord("bucketed").to_json())  # ours
    export.export_megatron(open_tree(str(tmp_path)))
    code, read = read_megatron_dataset(str(tmp_path / "megatron" / "1024" / "p01_00000"))
    assert code == 8 and [d.tolist() for d in read] == [t.tolist() for _, t in docs[2:]]


def test_llmc_shards_are_indexed_past_their_header(tmp_path):
    rng = np.random.default_rng(5)
    train = [llmc_doc(n, rng) for n in (4, 7, 3)]
    stream = sum(train, [])
    cut = len(train[0]) + 5  # the second document runs on into the next shard
    write_llmc(tmp_path / "train" / "shard_000.bin", stream[:cut])
    write_llmc(tmp_path / "train" / "shard_001.bin", stream[cut:])
    write_llmc(tmp_path / "val" / "shard_000.bin", llmc_doc(3, rng))
    (tmp_path / layout.STATS_NAME).write_text("scaffold test tree\n")
    shards = ["train/shard_000.bin", "train/shard_001.bin", "val/shard_000.bin"]
    (tmp_path / ownership.RECORD_NAME).write_text(ownership.TreeRecord("scaffold", shards).to_json())
    export.export_megatron(open_tree(str(tmp_path)))
    first_code, first = read_megatron_dataset(str(tmp_path / "megatron" / "train" / "shard_000"))
    _, second = read_megatron_dataset(str(tmp_path / "megatron" / "train" / "shard_001"))
    assert first_code == 8
    _, _, pointers, _ = read_idx(tmp_path / "megatron" / "train" / "shard_000.idx")
    assert pointers[0] == llmc.HEADER_BYTES
    # The split document is one sequence in each file; together they give the stream back.
    assert [len(d) for d in first] == [len(train[0]), 5] and len(second) == 2
    assert np.concatenate(first + second).tolist() == stream
    assert os.path.samefile(tmp_path / "megatron" / "train" / "shard_000.bin", tmp_path / "train" / "shard_000.bin")
    valid = (tmp_path / "megatron" / "valid_data_args.txt").read_text().split()
    assert valid[1::2] == ["megatron/val/shard_000"]
    assert export.check_megatron(open_tree(str(tmp_path))) == []


def test_ids_megatron_would_misread_are_refused():
    with pytest.raises(ValueError, match="does not fit Megatron's int32"):
        megatron.dtype_code("uint32", 2**31 + 1)
    assert megatron.dtype_code("uint32", 2**31) == (4, np.dtype("<i4"))
    with pytest.raises(ValueError, match="no dtype code for uint64"):
        megatron.dtype_code("uint64", 10)


def test_the_export_needs_a_finished_tree(tmp_path, capsys):
    rng = np.random.default_rng(0)
    write_bucketed_tree(tmp_path, {"1024/p00_00000.npy": [("a", doc_tokens(rng, 4))]}, marker=False)
    assert export.run(["megatron", "--output", str(tmp_path)]) == 2
    assert "has no dataset_stats.txt, so it is not a finished output tree" in capsys.readouterr().err
    assert not (tmp_path / "megatron").exists()
    with pytest.raises(IncompleteTreeError):
        open_tree(str(tmp_path))


def test_the_derived_names_publish_removes_are_the_ones_the_tools_write():
    from pipelines import export, stats
    from shards import layout

    assert set(layout.DERIVED_NAMES) == {export.EXPORT_DIR, stats.TABLE_NAME, stats.PNG_NAME}


# --------------------------------------------------------------------------------------------
# Megatron-core's own IndexedDataset, on an exported tree moved elsewhere (issue 25).


def megatron_documents(prefixes_file, cwd):
    """Every document of the blend, as Megatron-LM reads ``--data-args-path``: the file split on
    whitespace into (weight, prefix) pairs (megatron.core's get_blend_from_list), each prefix opened
    by megatron.core's IndexedDataset from the trainer's working directory."""
    datasets = import_trainer_module("megatron.core.datasets.indexed_dataset",
                                     "megatron-core is installed in CI: make venv-trainers")
    from megatron.core.datasets.utils import get_blend_from_list

    prefixes, weights = get_blend_from_list(prefixes_file.read_text().split())
    here = os.getcwd()
    os.chdir(cwd)
    try:
        out = {}
        for prefix in prefixes:
            ds = datasets.IndexedDataset(prefix)
            out[prefix] = [np.asarray(ds[d], dtype=np.int64) for d in range(len(ds))]
        return out, weights
    finally:
        os.chdir(here)


def shards_by_prefix(root, mount=None):
    per_file = {}
    for _, rel, _, tokens in manifest_view(root):
        prefix = "megatron/" + rel[: -len(".npy")]
        per_file.setdefault(prefix if mount is None else f"{mount}/{prefix}", []).append(tokens.astype(np.int64))
    return per_file


def cli(*args):
    from pipelines.cli import main

    return main(list(args))


def test_megatron_core_reads_a_moved_tree_through_its_relative_prefixes(tree_copy, tmp_path, capsys):
    assert cli("export", "megatron", "--output", str(tree_copy)) == 0
    moved = tmp_path / "elsewhere" / "finepdfs"
    moved.parent.mkdir()
    shutil.move(tree_copy, moved)
    assert not tree_copy.exists()
    assert cli("export", "megatron", "--output", str(moved), "--check") == 0
    out = capsys.readouterr().out
    assert "its prefixes are relative to the tree's root" in out and "indexes are current" in out
    got, weights = megatron_documents(moved / "megatron" / "data_args.txt", cwd=moved)
    want = shards_by_prefix(moved)
    assert list(got) == list(want)
    assert weights == [sum(len(t) for t in docs) for docs in want.values()]
    for prefix, docs in want.items():
        assert len(got[prefix]) == len(docs)
        assert all(np.array_equal(a, b) for a, b in zip(got[prefix], docs, strict=True)), prefix


def test_megatron_core_reads_a_tree_exported_for_its_mount_point(tree_copy, tmp_path, capsys):
    mount = tmp_path / "mnt" / "data"
    assert cli("export", "megatron", "--output", str(tree_copy), "--mount", f"{mount}/") == 0
    assert f"under {mount}, where the tree is to be mounted" in capsys.readouterr().out
    mount.parent.mkdir()
    shutil.copytree(tree_copy, mount, symlinks=True)
    assert cli("export", "megatron", "--output", str(mount), "--check", "--mount", str(mount)) == 0
    # Checked for another root than it was written for, the blend is stale, and says for which.
    assert cli("export", "megatron", "--output", str(mount), "--check") == 1
    assert "relative to the tree's root, are not the shards' now" in capsys.readouterr().out
    got, _ = megatron_documents(mount / "megatron" / "data_args.txt", cwd=tmp_path)  # any working directory
    want = shards_by_prefix(mount, mount=str(mount))
    assert list(got) == list(want)
    for prefix, docs in want.items():
        assert all(np.array_equal(a, b) for a, b in zip(got[prefix], docs, strict=True)), prefix


@pytest.mark.parametrize("mount", ["", " ", "/mnt/my data"])
def test_a_mount_point_megatron_would_split_is_refused(tree_copy, mount, capsys):
    with pytest.raises(SystemExit) as e:
        cli("export", "megatron", "--output", str(tree_copy), "--mount", mount)
    assert e.value.code == 2
    assert "the mount point must be a path without spaces" in capsys.readouterr().err
    assert not (tree_copy / "megatron").exists()
