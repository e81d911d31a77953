"""A store that fails mid-command (issue 35, case 7): 500 and 503 storms, connection resets and
bodies cut short, from tests/faults.py's FaultProxy on 127.0.0.1 in front of moto's S3 server, at
launch, in publish and in remove. Each time: one line on stderr naming the URL and what the store
said, no traceback, exit 2, the lock freed where the store could still be reached (else the line
says it was not); and the same command, run again once the faults are off, finishes with the tree
an undisturbed run writes (sha256 of every file)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from conftest import REPO, tree_hashes
from faults import FaultProxy
from test_object_storage import DESCRIPTION, IN_PROCESS, local_reference, s3, s3_tree_hashes  # noqa: F401
from test_object_storage import s3_endpoint as moto_endpoint  # noqa: F401 - the fixture

from pipelines import cli
from shards import lock
from shards.removal.lists import REMOVALS_NAME, parse_removal_line

FLAGS = ["--partitions", "2"]
_REFERENCE: dict[str, dict] = {}


@pytest.fixture(scope="module")
def proxy(moto_endpoint):  # noqa: F811 - the fixture
    server = FaultProxy(moto_endpoint)
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def s3_endpoint(proxy):
    """The s3 fixture's endpoint: the proxy, which passes every request on until a test says."""
    return proxy.endpoint


@pytest.fixture(autouse=True)
def _few_retries(proxy, monkeypatch):
    """The clients give up after two tries (botocore's and s3fs's own): a storm costs seconds."""
    import s3fs

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 2)
    proxy.off()
    yield
    proxy.off()


def reference(tmp_path) -> dict[str, str]:
    if "bucketed" not in _REFERENCE:
        _REFERENCE["bucketed"] = local_reference(tmp_path, *FLAGS)
    return _REFERENCE["bucketed"]


def bucketed_args(bucket: str) -> list[str]:
    return ["bucketed", "--input", f"s3://{bucket}/in/*.parquet", "--output", f"s3://{bucket}/out", *FLAGS,
            *IN_PROCESS]


def one_line(err: str, job: str) -> str:
    lines = [line for line in err.strip().splitlines() if " INFO " not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"pretokenize {job}: "), err
    return lines[0]


def storm_from(proxy: FaultProxy, mode: str, start, spare_lock: bool = True) -> threading.Event:
    """Faults on every request from the first that ``start(method, path, headers)`` picks on (that
    one included); the lock's own requests spared with ``spare_lock``. The event is set once begun."""
    begun = threading.Event()

    def when(method, path, headers):
        if not begun.is_set() and start(method, path, headers):
            begun.set()
        return begun.is_set() and not (spare_lock and lock.LOCK_NAME in path)

    proxy.faults(mode, when)
    return begun


@pytest.mark.parametrize("mode", ["503", "500", "reset", "cut"])
def test_a_store_failing_at_launch_is_one_line_naming_the_url_and_what_it_said(s3, proxy, tmp_path, capsys, mode):  # noqa: F811 - the fixture
    fs, bucket = s3
    proxy.faults(mode, lambda method, path, headers: method == "GET")
    assert cli.main(bucketed_args(bucket)) == 2
    line = one_line(capsys.readouterr().err, "bucketed")
    assert f"cannot reach s3://{bucket}/" in line, line
    said = {"503": "the store failed: HTTP 503 SlowDown (Please reduce your request rate.)",
            "500": "the store failed: HTTP 500 InternalError", "reset": "connection failed: ",
            "cut": "connection failed: "}[mode]
    assert said in line and "[Errno" not in line, line
    assert "nothing was published" in line
    proxy.off()
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/out/{lock.LOCK_NAME}")
    assert cli.main(bucketed_args(bucket)) == 0
    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == reference(tmp_path)


def _publishing(method, path, headers) -> bool:
    return method == "PUT" and path.split("?")[0].endswith("/publishing")


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_a_store_failing_in_publish_is_one_line_and_the_same_command_finishes(s3, proxy, tmp_path, capsys, mode):  # noqa: F811 - the fixture
    fs, bucket = s3
    begun = storm_from(proxy, mode, _publishing)
    assert cli.main(bucketed_args(bucket)) == 2
    assert begun.is_set()
    line = one_line(capsys.readouterr().err, "bucketed")
    assert f"cannot reach s3://{bucket}/out: " in line and ("HTTP 503 SlowDown" if mode == "503" else
                                                           "connection failed") in line, line
    assert "its temporary files could not be deleted" in line and "run the same command again" in line, line
    assert "could not be freed" not in line  # the lock's requests went through: it was freed
    proxy.off()
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/out/{lock.LOCK_NAME}")
    assert cli.main(bucketed_args(bucket)) == 0
    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == reference(tmp_path)


def test_a_store_lost_for_good_in_publish_says_the_lock_was_not_freed(s3, proxy, s3_endpoint, tmp_path):  # noqa: F811 - the fixture
    """Every request fails from the publish on, the lock's too: the line says the lock is left, and
    the next command frees it (its holder is gone)."""
    fs, bucket = s3
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run():
        return subprocess.run([sys.executable, "-m", "pipelines.cli", *bucketed_args(bucket)], cwd=REPO,
                              capture_output=True, text=True, timeout=600, env=env)

    storm_from(proxy, "503", _publishing, spare_lock=False)
    failed = run()
    assert failed.returncode == 2, failed.stderr[-3000:]
    line = one_line(failed.stderr, "bucketed")
    assert f"cannot reach s3://{bucket}/out: the store failed: HTTP 503 SlowDown" in line, line
    assert f"its lock s3://{bucket}/out/{lock.LOCK_NAME} could not be freed (the store failed: HTTP 503" in line
    proxy.off()
    fs.invalidate_cache()
    assert fs.exists(f"{bucket}/out/{lock.LOCK_NAME}")
    again = run()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "that process is no longer running on this host" in again.stderr
    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == reference(tmp_path)


def _rewriting(method, path, headers) -> bool:
    return method == "PUT" and "/rewrite/" in path


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_a_store_failing_in_remove_is_one_line_and_the_same_command_finishes(s3, proxy, tmp_path, capsys, mode):  # noqa: F811 - the fixture
    fs, bucket = s3
    out = f"s3://{bucket}/out"
    ids = tmp_path / "ids.txt"
    assert cli.main(bucketed_args(bucket)) == 0
    fs.invalidate_cache()
    rows = fs.cat_file(f"{bucket}/out/processed_spec.txt").decode().splitlines()[1:]
    ids.write_text("".join(f"{row.split(' | ')[1]}\n" for row in rows[::7]), encoding="utf-8")
    remove = ["remove", "--output", out, "--removal-list", str(ids), *IN_PROCESS]
    fs.copy(f"{bucket}/out", f"{bucket}/ref", recursive=True)
    assert cli.main(["remove", "--output", f"s3://{bucket}/ref", "--removal-list", str(ids), *IN_PROCESS]) == 0
    capsys.readouterr()

    begun = storm_from(proxy, mode, _rewriting)
    assert cli.main(remove) == 2
    assert begun.is_set()
    line = one_line(capsys.readouterr().err, "remove")
    assert f"cannot reach s3://{bucket}/out: " in line, line
    assert "run the same command again" in line and "could not be freed" not in line, line
    proxy.off()
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/out/{lock.LOCK_NAME}")
    assert cli.main(remove) == 0
    # Every file the same, but the audit log's run id and time (each removal has its own).
    skip = (*DESCRIPTION, REMOVALS_NAME)
    fs.invalidate_cache()
    here, there = (tmp_path / "here", tmp_path / "there")
    fs.get(f"{bucket}/out/", f"{here}/", recursive=True)
    fs.get(f"{bucket}/ref/", f"{there}/", recursive=True)
    assert tree_hashes(here, skip) == tree_hashes(there, skip)
    assert audit_lines(here) == audit_lines(there)


def audit_lines(tree) -> list[tuple]:
    lines = (tree / REMOVALS_NAME).read_text(encoding="utf-8").splitlines()
    return lines[:2] + sorted(parse_removal_line(line)[2:] for line in lines[2:])
