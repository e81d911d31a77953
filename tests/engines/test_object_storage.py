"""The bucketed job reading from and writing to s3:// (s3fs) against moto's S3 server on 127.0.0.1.

An object store has no rename: s3fs's mv is a server-side copy and a delete, so a shard "moved" into
place appears whole (a copy is all-or-nothing) but the set of files changes one object at a time.
What keeps a reader safe is the order of the publish step, with dataset_stats.txt written last as the
commit point. These tests run the job end to end on S3 with worker processes of their own, compare
its bytes with a local run, run `verify` on the S3 output, re-run into it, and crash a publish midway.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from conftest import SAMPLE_PARQUET
from engine_setup import tree_hashes

from pipelines import bucketed, verify
from shards import layout
from shards.card import CARD_NAME
from shards.provenance import STATS_JSON_NAME

pytest.importorskip("moto.server", reason="moto's S3 server is in the test extra: pip install -e '.[test]'")
s3fs = pytest.importorskip("s3fs", reason="s3fs is in the test and aws extras: pip install -e '.[test]'")
fsspec = pytest.importorskip("fsspec")

FLAGS = ["--partitions", "4", "--max-shard-bytes", "120000"]
TWO_WORKERS = ["--runner=FnApiRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
IN_PROCESS = ["--runner=FnApiRunner"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's standalone S3 server on a free loopback port, for this module."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto's S3 server did not start on {endpoint}")
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """A fresh bucket; every fsspec s3:// in this process and in worker processes goes to moto.

    Worker processes read the endpoint from FSSPEC_S3_ENDPOINT_URL (fsspec's configuration from the
    environment, loaded when fsspec is imported); this process, where fsspec is already imported,
    gets the same setting in fsspec.config.conf. The credentials are moto's dummies.
    """
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "FSSPEC_S3_ENDPOINT_URL": s3_endpoint,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_endpoint})
    s3fs.S3FileSystem.clear_instance_cache()
    fs = fsspec.filesystem("s3")
    bucket = f"pretokenize-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    fs.put(str(SAMPLE_PARQUET), f"{bucket}/in/{SAMPLE_PARQUET.name}")
    yield fs, bucket
    s3fs.S3FileSystem.clear_instance_cache()


# dataset_stats.json and the card name the input files (s3:// here, a local path in the reference).
DESCRIPTION = (STATS_JSON_NAME, CARD_NAME)


def s3_tree_hashes(fs, root: str, tmp_path) -> dict[str, str]:
    fs.invalidate_cache()
    local = tmp_path / f"download-{uuid.uuid4().hex[:8]}"
    fs.get(f"{root}/", f"{local}/", recursive=True)
    return tree_hashes(local, skip=DESCRIPTION)


def local_reference(tmp_path, *flags) -> dict[str, str]:
    out = tmp_path / f"local-{uuid.uuid4().hex[:8]}"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), *flags, *IN_PROCESS])
    return tree_hashes(out, skip=DESCRIPTION)


def test_s3_in_s3_out_with_worker_processes_matches_a_local_run_and_verifies(s3, tmp_path):
    fs, bucket = s3
    out = f"s3://{bucket}/out"
    stats = bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, *FLAGS, *TWO_WORKERS])
    assert stats.kept_documents > 0

    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == local_reference(tmp_path, *FLAGS)
    assert not fs.exists(f"{bucket}/out/{layout.TEMP_DIR_NAME}"), "spill and staging files were left behind"
    # verify reads the tree on S3 and re-tokenizes the S3 input to compare every document.
    assert verify.run(["--output", out, "--input", f"s3://{bucket}/in/{SAMPLE_PARQUET.name}", *IN_PROCESS]) == 0


def test_a_rerun_on_s3_replaces_the_output_whole(s3, tmp_path):
    fs, bucket = s3
    out = f"s3://{bucket}/out"
    bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, *FLAGS, *IN_PROCESS])
    # Fewer partitions: the second run must delete the first run's p02/p03 files, not leave them.
    fewer = ["--partitions", "2", "--max-shard-bytes", "120000"]
    bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, *fewer, *IN_PROCESS])
    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == local_reference(tmp_path, *fewer)
    assert verify.run(["--output", out, *IN_PROCESS]) == 0


def test_a_publish_that_dies_midway_on_s3_looks_unfinished_and_a_rerun_completes_it(s3, tmp_path, monkeypatch):
    fs, bucket = s3
    out = f"s3://{bucket}/out"
    bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, "--partitions", "3", *IN_PROCESS])

    # s3fs's sync methods are bound per instance, so patch the async method they call.
    real_copy = s3fs.S3FileSystem._copy
    moved_into_place = []

    async def dying_copy(self, path1, path2, *args, **kwargs):
        # Publish copies the staged shards to their final names in one batch: copy three of them,
        # then die, as a worker killed in the middle of publishing would.
        if isinstance(path1, list) and any("/staged/" in p for p in path1):
            await real_copy(self, path1[:3], path2[:3], *args, **kwargs)
            moved_into_place.extend(path2[:3])
            raise OSError("simulated crash while moving shards into place")
        return await real_copy(self, path1, path2, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_copy", dying_copy)
    s3fs.S3FileSystem.clear_instance_cache()  # instances bind their sync methods when made
    with pytest.raises(Exception, match="simulated crash"):
        bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, *FLAGS, *IN_PROCESS])
    monkeypatch.setattr(s3fs.S3FileSystem, "_copy", real_copy)
    s3fs.S3FileSystem.clear_instance_cache()

    fs.invalidate_cache()
    assert len(moved_into_place) == 3 and all(fs.exists(p) for p in moved_into_place)
    # Some new shards are in place, but no commit marker: nothing here may be taken for finished.
    assert not fs.exists(f"{bucket}/out/{layout.STATS_NAME}")
    assert not fs.exists(f"{bucket}/out/{layout.MANIFEST_NAME}")
    assert verify.run(["--output", out, *IN_PROCESS]) == 1

    bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, *FLAGS, *IN_PROCESS])
    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == local_reference(tmp_path, *FLAGS)


def test_s3_with_two_workers_writes_the_bytes_the_old_code_wrote_locally(s3, tmp_path):
    """The default layout (32 partitions: 320 write groups, each fetched from S3 in coalesced range
    requests) on S3 with 2 worker processes gives, file for file, the hashes test_no_byte_changes
    recorded from the code before issue 26 on a local disk with one worker."""
    from test_no_byte_changes import DESCRIPTION as RECORDED_DESCRIPTION
    from test_no_byte_changes import SAMPLE_HASHES

    fs, bucket = s3
    out = f"s3://{bucket}/default"
    bucketed.run(["--input", f"s3://{bucket}/in/*.parquet", "--output", out, *TWO_WORKERS])
    fs.invalidate_cache()
    local = tmp_path / "download"
    fs.get(f"{bucket}/default/", f"{local}/", recursive=True)
    assert tree_hashes(local, skip=RECORDED_DESCRIPTION) == SAMPLE_HASHES


def test_a_tree_rewritten_on_s3_reopens_as_it_is_now_in_the_same_process(s3, s3_endpoint, tmp_path):
    """A long-lived process (a trainer) opens a tree on S3, the tree is rewritten elsewhere (a removal
    applied by another machine), and the process opens it again: it must read the tree as it is now,
    not through the listings and sizes its S3 client cached at the first open (which gave windows of
    the old index over the new shards, and the removed document still listed)."""
    import shutil

    import s3fs

    from pipelines import cli
    from shards import reader

    fs, bucket = s3
    before, after = tmp_path / "before", tmp_path / "after"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(before), *IN_PROCESS]) == 0
    shutil.copytree(before, after)
    gone = reader.open_tree(str(before)).documents.id(0)
    (tmp_path / "ids.txt").write_text(f"{gone}\n")
    assert cli.main(["remove", "--output", str(after), "--removal-list", str(tmp_path / "ids.txt"), *IN_PROCESS]) == 0
    elsewhere = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3_endpoint)  # another machine's client
    elsewhere.put(f"{before}/", f"{bucket}/t/", recursive=True)
    first = reader.open_tree(f"s3://{bucket}/t")
    first.documents.index_of(gone)  # there, before the removal
    elsewhere.rm(f"{bucket}/t", recursive=True)
    elsewhere.put(f"{after}/", f"{bucket}/t/", recursive=True)

    now, expected = reader.open_tree(f"s3://{bucket}/t"), reader.open_tree(str(after))
    assert len(now) == len(expected) == len(first) - 1
    with pytest.raises(KeyError):
        now.documents.index_of(gone)
    for k in range(5):
        assert (now.sampler(128, seed=0).window(k).inputs == expected.sampler(128, seed=0).window(k).inputs).all()
