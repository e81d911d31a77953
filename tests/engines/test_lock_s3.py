"""The tree's lock on S3 (moto's server on 127.0.0.1): a create-if-absent the server enforces.

The lock object is created with PutObject ``If-None-Match: *``, renewed with ``If-Match: ETag`` and
deleted with ``If-Match: ETag`` (shards/lock.py); these tests watch the requests go out and the
server refuse the second of two creates, then run a command on an s3:// output under a held lock.
"""

from __future__ import annotations

import pytest
from conftest import SAMPLE_PARQUET
from test_object_storage import IN_PROCESS, s3, s3_endpoint  # noqa: F401 - the fixtures

from pipelines import cli
from shards import lock
from shards.tree import RECORD_NAME

FLAGS = ["--partitions", "2"]


def _headers_of(fs, operation: str) -> list[dict]:
    """The headers of every ``operation`` request (PutObject, DeleteObject) the client sends."""
    sent = []
    fs.s3.meta.events.register(f"before-send.s3.{operation}", lambda request, **_: sent.append(
        {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}))
    return sent


def test_two_creates_the_second_refused_by_the_server(s3):  # noqa: F811 - the fixture
    fs, bucket = s3
    url = f"s3://{bucket}/out"
    store = lock._store(url)
    assert isinstance(store, lock._S3Store)
    puts = _headers_of(store.fs, "PutObject")
    first = lock.Holder.new("pretokenize first").to_json()
    store.create(first)
    with pytest.raises(FileExistsError):
        store.create(lock.Holder.new("pretokenize second").to_json())
    assert [h.get("If-None-Match") for h in puts] == ["*", "*"]
    assert fs.cat_file(f"{bucket}/out/{lock.LOCK_NAME}") == first  # the server kept the first


def test_a_renewal_and_a_release_never_touch_a_lock_taken_since(s3):  # noqa: F811 - the fixture
    fs, bucket = s3
    url = f"s3://{bucket}/out"
    with lock.scope("pretokenize mine"):
        taken = lock.take(url)
        store = taken.store
        puts, deletes = _headers_of(store.fs, "PutObject"), _headers_of(store.fs, "DeleteObject")
        assert taken.renew()  # If-Match: the ETag it created
        assert puts[-1].get("If-Match", "").strip('"') == taken.version.strip('"')
        other = lock.Holder.new("pretokenize other").to_json()
        fs.pipe_file(f"{bucket}/out/{lock.LOCK_NAME}", other)  # another command took it (--break-lock)
        assert taken.renew() is False and taken.lost
    assert fs.cat_file(f"{bucket}/out/{lock.LOCK_NAME}") == other
    # Released without a request: a lock that was lost is not ours to delete.
    assert deletes == []
    found = lock.holder(url)
    assert found.holder.command == "pretokenize other"
    assert store.remove(found.version) and deletes[-1].get("If-Match")
    assert lock.holder(url) is None


def test_a_bucketed_run_on_s3_is_refused_while_another_holds_its_output_then_runs(s3, capsys):  # noqa: F811 - the fixture
    fs, bucket = s3
    out = f"s3://{bucket}/out"
    args = ["bucketed", "--input", f"s3://{bucket}/in/*.parquet", "--output", out, *FLAGS, *IN_PROCESS]
    with lock.scope("pretokenize remove --output " + out):
        lock.take(out)
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert f"is locked by another command, `pretokenize remove --output {out}` (host " in err
        fs.invalidate_cache()
        assert fs.ls(f"{bucket}/out", detail=False) == [f"{bucket}/out/{lock.LOCK_NAME}"]  # no record was written
    assert lock.holder(out) is None
    assert cli.main(args) == 0
    fs.invalidate_cache()
    assert fs.exists(f"{bucket}/out/{RECORD_NAME}") and not fs.exists(f"{bucket}/out/{lock.LOCK_NAME}")
    assert cli.main(["verify", "--output", out, *IN_PROCESS]) == 0


def test_a_dead_holders_lock_on_s3_is_freed_by_the_next_command(s3, tmp_path, capsys):  # noqa: F811 - the fixture
    import subprocess
    import sys

    fs, bucket = s3
    out = f"s3://{bucket}/out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", out, *FLAGS, *IN_PROCESS]) == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = lock.Holder.new("pretokenize stats --output " + out)
    holder = lock.Holder(**{**holder.__dict__, "pid": int(dead.stdout)})
    fs.pipe_file(f"{bucket}/out/{lock.LOCK_NAME}", holder.to_json())
    assert cli.main(["stats", "--output", out, "--png", "none"]) == 0
    err = capsys.readouterr().err
    assert f"freed the lock of `pretokenize stats --output {out}` (host " in err and "no longer running" in err
    assert lock.holder(out) is None
