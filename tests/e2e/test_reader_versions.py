"""A reader never serves a byte the tree does not hold (issue 35, the reading side): every file it
reads is a shard of the layout inside the tree; an index is used only once it proves it describes
the manifest; a reader serves the version it opened or refuses in one line (TreeChangedError),
in its own process and in a worker it was pickled to; the index cache trusts only the user's own.

Each test is one numbered case of the issue; the last is a seeded random walk over open, read,
remove, re-run, pickle-and-read and edits of the index and the cache."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import finepdfs_row

from pipelines import cli
from shards import index as reader_index
from shards import layout, manifest, reader, storage, tree
from shards.reading.store import IndexedDocuments

ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a document read while it changes. " * (2 + i % 11))
        for i in range(48)]


def truth(root: Path) -> dict[str, np.ndarray]:
    """Every document of the tree as it is now, from its manifest and shard bytes (no reader code)."""
    docs, offsets = {}, {}
    with open(root / layout.MANIFEST_NAME, encoding="utf-8") as f:
        for rel, doc_id, n in manifest.read_rows(f):
            at = offsets.get(rel, 0)
            docs[doc_id] = np.fromfile(root / rel, dtype="<u4", count=n, offset=at * 4)
            offsets[rel] = at + n
    return docs


def remove(root, ids, tmp_path: Path) -> None:
    listing = tmp_path / f"ids-{len(list(tmp_path.iterdir()))}.txt"
    listing.write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    assert cli.main(["remove", "--output", str(root), "--removal-list", str(listing), "--runner=FnApiRunner"]) == 0


def read_or_refused(t, doc_id: str):
    """The tokens the reader gives for ``doc_id``, or None when it refused in one line."""
    try:
        return np.array(t.document(doc_id))
    except reader.TreeChangedError as e:
        assert "\n" not in str(e) and str(t.url) in str(e)
        return None


def shard_of(root: Path) -> dict[str, str]:
    with open(root / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return {doc_id: rel for rel, doc_id, _ in manifest.read_rows(f)}


def craft(path: Path, edit) -> None:
    """Edit an index's bytes as someone crafting one would: for a version 2 index, its own sha256 is
    made to hold again, so only the reader's other checks can catch the edit."""
    data = bytearray(path.read_bytes())
    edit(data)
    if struct.unpack_from("<I", data, 8)[0] == 2:
        data[-32:] = hashlib.sha256(bytes(data[:-32])).digest()
    path.write_bytes(bytes(data))


def start_column(data: bytearray) -> tuple[int, int]:
    """(offset, size) of the index's start column, from its header."""
    return struct.unpack_from("<QQ", data, 40 + 16 * reader_index.SECTIONS.index("start"))


# -- 1. a link out of the tree -------------------------------------------------------------------

def test_1_a_bucket_directory_or_shard_linked_out_of_the_tree_is_refused_with_the_index(tree_copy, tmp_path):
    t = reader.open_tree(str(tree_copy))
    assert isinstance(t.documents, IndexedDocuments)
    bucket = t.store.rel_paths[0].split("/")[0]
    elsewhere = tmp_path / "elsewhere"
    shutil.move(tree_copy / bucket, elsewhere)
    (tree_copy / bucket).symlink_to(elsewhere)
    with pytest.raises(tree.UnsafePathError, match="outside the tree") as e:
        reader.open_tree(str(tree_copy))
    assert "\n" not in str(e.value) and str(tree_copy) in str(e.value)
    (tree_copy / bucket).unlink()
    shutil.move(elsewhere, tree_copy / bucket)
    shard = tree_copy / t.store.rel_paths[-1]
    shutil.move(shard, tmp_path / "shard.npy")
    shard.symlink_to(tmp_path / "shard.npy")
    with pytest.raises(tree.UnsafePathError, match=t.store.rel_paths[-1]):
        reader.open_tree(str(tree_copy))



@pytest.mark.parametrize("name", [layout.STATS_NAME, tree.RECORD_NAME])
def test_1_the_stats_or_the_record_linked_out_of_the_tree_is_refused(tree_copy, tmp_path, name):
    """The stats say the tokens' dtype and EOS id (a window's loss mask), the record the tree's kind
    and its index: neither is read through a link out of the tree."""
    moved = tmp_path / name
    shutil.move(tree_copy / name, moved)
    (tree_copy / name).symlink_to(moved)
    with pytest.raises(tree.UnsafePathError, match="outside the tree") as e:
        reader.open_tree(str(tree_copy))
    assert "\n" not in str(e.value) and name in str(e.value)

# -- 2. a crafted index naming a file outside ------------------------------------------------------

def test_2_an_index_naming_a_file_outside_the_tree_is_not_used(tree_copy, tmp_path, caplog, capsys):
    expected = truth(tree_copy)
    first = reader.open_tree(str(tree_copy)).store.rel_paths[0]
    outside = "../" + "l" * (len(first) - len("../.npy")) + ".npy"  # the same length: offsets stay
    (tree_copy / outside).write_bytes(np.full(os.path.getsize(tree_copy / first) // 4, 7, "<u4").tobytes())

    def rename(data):
        at = data.index(first.encode())
        data[at:at + len(first)] = outside.encode()

    craft(tree_copy / reader_index.INDEX_NAME, rename)
    caplog.set_level(logging.WARNING)
    t = reader.open_tree(str(tree_copy))
    assert outside not in t.store.rel_paths
    for doc_id, tokens in expected.items():
        np.testing.assert_array_equal(t.document(doc_id), tokens)
    warned = [r.getMessage() for r in caplog.records if "reader index is not used" in r.getMessage()]
    assert len(warned) == 1 and str(tree_copy) in warned[0]
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(tree_copy), "--runner=FnApiRunner"]) == 1
    said = [line for line in capsys.readouterr().out.splitlines() if reader_index.INDEX_NAME in line]
    assert said and "readers do not use it" in said[0]


# -- 3. a stale or damaged index -------------------------------------------------------------------

def test_3_a_manifest_edited_to_the_same_size_is_read_not_the_stale_index(tree_copy):
    path = tree_copy / layout.MANIFEST_NAME
    text = path.read_text(encoding="utf-8")
    a, b = "doc-10", "doc-21"  # ids of one length: the manifest keeps its size
    swapped = text.replace(f"| {a} |", "| SWAP |").replace(f"| {b} |", f"| {a} |").replace("| SWAP |", f"| {b} |")
    assert swapped != text and len(swapped) == len(text)
    path.write_text(swapped, encoding="utf-8")
    expected = truth(tree_copy)
    t = reader.open_tree(str(tree_copy))
    for doc_id in (a, b):
        np.testing.assert_array_equal(t.document(doc_id), expected[doc_id])


def test_3_an_index_whose_start_column_is_shifted_is_not_used(tree_copy):
    expected = truth(tree_copy)

    def shift(data):
        at, size = start_column(data)
        starts = np.frombuffer(bytes(data[at:at + size]), "<i8").copy()
        starts[1:-1] += 3  # every document but the first and last a few tokens later: in bounds
        data[at:at + size] = starts.tobytes()

    craft(tree_copy / reader_index.INDEX_NAME, shift)
    t = reader.open_tree(str(tree_copy))
    for doc_id, tokens in expected.items():
        np.testing.assert_array_equal(t.document(doc_id), tokens)


def section(data: bytearray, name: str) -> tuple[int, int]:
    """(offset, size) of the index's section ``name``, from its header."""
    return struct.unpack_from("<QQ", data, 40 + 16 * reader_index.SECTIONS.index(name))


def swap_ids(a: str, b: str):
    """An edit (for ``craft``) swapping two ids of one length in the id blob and in the lookup table:
    every structural check stays true, so only comparing its rows with the manifest's catches it."""

    def swap(data):
        at, size = section(data, "id_blob")
        blob = bytes(data[at:at + size])
        i, j = blob.index(a.encode()), blob.index(b.encode())
        data[at + i:at + i + len(a)], data[at + j:at + j + len(b)] = b.encode(), a.encode()
        off_at, off_size = section(data, "id_offsets")
        offsets = np.frombuffer(bytes(data[off_at:off_at + off_size]), "<i8")
        row_a, row_b = int(np.searchsorted(offsets, i, "right")) - 1, int(np.searchsorted(offsets, j, "right")) - 1
        at, size = section(data, "hash_rows")
        rows = np.frombuffer(bytes(data[at:at + size]), "<i8").copy()
        pa, pb = int(np.flatnonzero(rows == row_a)[0]), int(np.flatnonzero(rows == row_b)[0])
        rows[pa], rows[pb] = row_b, row_a
        data[at:at + size] = rows.tobytes()

    return swap


def test_3_an_index_whose_ids_are_swapped_consistently_is_not_used(tree_copy):
    expected = truth(tree_copy)
    a, b = "doc-10", "doc-21"
    assert not np.array_equal(expected[a], expected[b])
    craft(tree_copy / reader_index.INDEX_NAME, swap_ids(a, b))
    t = reader.open_tree(str(tree_copy))
    for doc_id in (a, b):
        np.testing.assert_array_equal(t.document(doc_id), expected[doc_id], err_msg=doc_id)


def hide(doc_id: str, how: str):
    """An edit (for ``craft``) of the lookup table alone that leaves it sorted and a permutation of
    the rows (every check at open holds) but without a true entry for ``doc_id``: its hash replaced
    by a neighbour's ("hash"), or its row swapped with another entry's ("row")."""

    def edit(data):
        at, size = section(data, "hashes")
        hashes = np.frombuffer(bytes(data[at:at + size]), "<u8").copy()
        rows_at, rows_size = section(data, "hash_rows")
        rows = np.frombuffer(bytes(data[rows_at:rows_at + rows_size]), "<i8").copy()
        p = int(np.flatnonzero(hashes == np.uint64(reader_index.id_hash(doc_id.encode())))[0])
        other = p - 1 if p else p + 1
        if how == "hash":
            hashes[p] = hashes[other]
            data[at:at + size] = hashes.tobytes()
        else:
            rows[[p, other]] = rows[[other, p]]
            data[rows_at:rows_at + rows_size] = rows.tobytes()

    return edit


@pytest.mark.parametrize("how", ["hash", "row"])
def test_3_a_lookup_table_crafted_to_hide_an_id_does_not_hide_its_document(tree_copy, how):
    """Never a false KeyError: the manifest holds the id, so the reader serves its document."""
    expected = truth(tree_copy)
    craft(tree_copy / reader_index.INDEX_NAME, hide("doc-10", how))
    t = reader.open_tree(str(tree_copy))
    assert t.documents.__class__.__name__ == "IndexedDocuments"  # the crafted index passed the checks at open
    for doc_id, tokens in expected.items():
        np.testing.assert_array_equal(t.document(doc_id), tokens, err_msg=doc_id)
    for absent in ("doc-1", "doc-100", "doc-1x", ""):
        with pytest.raises(KeyError):
            t.document(absent)


def test_3_a_mark_left_by_the_weaker_proof_of_before_does_not_vouch_for_an_index(tree_copy, tmp_path, monkeypatch):
    """Marks left before the proof compared an index's rows said only that its digests held."""
    monkeypatch.setenv(reader_index.CACHE_ENV, str(tmp_path / "cache"))
    expected = truth(tree_copy)
    index, manifest_path = tree_copy / reader_index.INDEX_NAME, tree_copy / layout.MANIFEST_NAME
    craft(index, swap_ids("doc-10", "doc-21"))
    identities = (reader_index.identity(os.stat(index)), reader_index.identity(os.stat(manifest_path)))
    reader_index.mark(reader_index.trusted_cache(), ("index", os.path.realpath(index), *identities))
    t = reader.open_tree(str(tree_copy))
    for doc_id in ("doc-10", "doc-21"):
        np.testing.assert_array_equal(t.document(doc_id), expected[doc_id], err_msg=doc_id)

def test_an_index_of_the_first_version_is_not_trusted_and_the_warning_says_why(tree_copy, caplog):
    path = tree_copy / reader_index.INDEX_NAME
    data = bytearray(path.read_bytes()[:-reader_index.TRAILER.size])  # as version 1 wrote it
    struct.pack_into("<I", data, 8, 1)
    path.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING)
    t = reader.open_tree(str(tree_copy))
    assert not isinstance(t.documents, IndexedDocuments)
    assert any("version 1, which proves no manifest" in r.getMessage() for r in caplog.records)


# -- 4. a reader open across a remove --------------------------------------------------------------

def _ids_in_two_shards(root: Path) -> tuple[str, str]:
    where = shard_of(root)
    files = sorted(set(where.values()))
    return next(i for i, r in where.items() if r == files[0]), next(i for i, r in where.items() if r == files[-1])


@pytest.mark.parametrize("by_index", [True, False])
def test_4_a_reader_open_across_a_remove_serves_its_version_or_refuses(tree_copy, tmp_path, by_index):
    if not by_index:
        os.remove(tree_copy / reader_index.INDEX_NAME)  # opened by its manifest
    before = truth(tree_copy)
    early, late = _ids_in_two_shards(tree_copy)
    t = reader.open_tree(str(tree_copy))
    np.testing.assert_array_equal(t.document(early), before[early])  # its shard is mapped now
    worker = pickle.dumps(t)
    remove(tree_copy, [early, late], tmp_path)
    refused = 0
    for doc_id, tokens in before.items():
        got = read_or_refused(t, doc_id)
        refused += got is None
        if got is not None:
            np.testing.assert_array_equal(got, tokens)
    assert read_or_refused(t, late) is None  # its shard was rewritten after the open, never mapped
    np.testing.assert_array_equal(t.document(early), before[early])  # the mapped shard keeps its bytes
    try:
        spawned = pickle.loads(worker)  # noqa: S301 - our own object, pickled above
    except reader.TreeChangedError:
        return  # refused as the worker starts: the index it would map is another version's
    assert not by_index
    for doc_id, tokens in before.items():
        got = read_or_refused(spawned, doc_id)
        assert got is None or np.array_equal(got, tokens), doc_id
    assert read_or_refused(spawned, early) is None


# -- 5. the index cache ----------------------------------------------------------------------------

def _to_memory(fs, root: Path, prefix: str) -> str:
    for path in root.rglob("*"):
        if path.is_file():
            fs.pipe(f"/{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())
    return f"memory://{prefix}"


def _shift_two_starts(data: bytearray) -> None:
    at, _ = start_column(data)
    a, b = struct.unpack_from("<qq", data, at + 8 * 3)
    struct.pack_into("<qq", data, at + 8 * 3, b, a)


def test_5_a_cached_copy_edited_in_place_with_its_mtime_restored_is_not_served(bucketed_tree, tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv(reader_index.CACHE_ENV, str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    url = _to_memory(fs, bucketed_tree, "edited-copy")
    expected = truth(bucketed_tree)
    try:
        reader.open_tree(url)
        (copy,) = (tmp_path / "cache").glob("*.idx")
        st = copy.stat()
        craft(copy, _shift_two_starts)
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        t = reader.open_tree(url)
        for doc_id, tokens in expected.items():
            np.testing.assert_array_equal(t.document(doc_id), tokens)
    finally:
        fs.rm("/edited-copy", recursive=True)


def test_5_a_shared_cache_directory_others_can_write_is_ignored(bucketed_tree, tmp_path, monkeypatch, caplog):
    import fsspec

    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv(reader_index.CACHE_ENV, str(cache))
    fs = fsspec.filesystem("memory")
    url = _to_memory(fs, bucketed_tree, "shared-cache")
    expected = truth(bucketed_tree)
    try:
        # Another user plants a copy under the name a reader would look for, stamped as a reader stamps.
        index_url = storage.join(url, reader_index.INDEX_NAME)
        info = fs.info("/shared-cache/" + reader_index.INDEX_NAME)
        tree_key = hashlib.blake2b(index_url.encode(), digest_size=8).hexdigest()
        key = hashlib.blake2b(f"{index_url}\n{info['size']}\n{storage.file_version(info)}".encode(),
                              digest_size=16).hexdigest()
        planted = cache / f"{tree_key}-{key}.idx"
        shutil.copy(bucketed_tree / reader_index.INDEX_NAME, planted)
        craft(planted, _shift_two_starts)
        stamp = int(key[:8], 16) * 1_000_000_000
        os.utime(planted, ns=(stamp, stamp))
        if os.getuid() == 0:
            os.chown(planted, 4242, 4242)
        caplog.set_level(logging.WARNING)
        t = reader.open_tree(url)
        for doc_id, tokens in expected.items():
            np.testing.assert_array_equal(t.document(doc_id), tokens)
        assert any("others can write it" in r.getMessage() for r in caplog.records)
    finally:
        fs.rm("/shared-cache", recursive=True)


# -- the random walk -------------------------------------------------------------------------------

def _check_reads(t, snapshot: dict[str, np.ndarray], ids) -> None:
    for doc_id in ids:
        got = read_or_refused(t, doc_id)
        assert got is None or np.array_equal(got, snapshot[doc_id]), f"{doc_id}: a wrong token"


def _step(op: str, rng: random.Random, root: Path, source: Path, tmp_path: Path, readers: list) -> None:
    if op == "open":
        t = reader.open_tree(str(root))
        now = truth(root)
        _check_reads(t, now, now)  # a fresh reader is the tree as it is now, whatever came before
        assert sorted(t.documents.id(i) for i in range(len(t))) == sorted(now)
        readers.append((t, now))
    elif op in ("read", "pickle") and readers:
        t, snapshot = rng.choice(readers)
        if op == "pickle":
            try:
                t = pickle.loads(pickle.dumps(t))  # noqa: S301 - our own object: a spawned worker's copy
            except reader.TreeChangedError:
                return
            readers.append((t, snapshot))
        _check_reads(t, snapshot, rng.sample(sorted(snapshot), min(8, len(snapshot))))
    elif op == "remove":
        ids = sorted(truth(root))
        if len(ids) > 6:
            remove(root, rng.sample(ids, rng.randint(1, 3)), tmp_path)
    elif op == "rerun":
        assert cli.main(["bucketed", "--input", str(source), "--output", str(root), "--partitions", "2",
                         "--runner=FnApiRunner"]) == 0
    elif op == "edit index":  # by a new file renamed over it, as an editor saves (one written in place
        edited = tmp_path / "edited.idx"  # under a reader's map is that reader's to see: see the docs)
        shutil.copy(root / reader_index.INDEX_NAME, edited)
        craft(edited, _shift_two_starts)
        os.replace(edited, root / reader_index.INDEX_NAME)
    elif op == "edit cache":
        for mark in Path(reader_index.cache_dir()).glob("mark-*"):
            mark.unlink() if rng.random() < 0.5 else mark.chmod(0o666)  # gone, or others could have written it


OPS = ["open"] * 3 + ["read"] * 4 + ["pickle"] * 2 + ["remove"] * 2 + ["edit index", "edit cache"]


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_never_serve_a_wrong_token(bucketed_tree, source, tmp_path, monkeypatch, seed):
    """Open, read, remove, re-run, pickle-and-read, edits of the index and of the cache, in a seeded
    random order: every byte any reader returns is its opened version's document of that id, and a
    fresh reader's is the tree's current one; otherwise the read is refused in one line."""
    rng = random.Random(seed)
    root = Path(shutil.copytree(bucketed_tree, tmp_path / "out", symlinks=True))
    monkeypatch.setenv(reader_index.CACHE_ENV, str(tmp_path / "cache"))
    readers: list = []
    reran = False
    for _ in range(12):
        op = rng.choice(OPS + ([] if reran else ["rerun"]))
        reran |= op == "rerun"
        _step(op, rng, root, source, tmp_path, readers)
    _step("open", rng, root, source, tmp_path, readers)
    for t, snapshot in readers:
        _check_reads(t, snapshot, snapshot)
