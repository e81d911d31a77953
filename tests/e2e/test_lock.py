"""One writer at a time (issue 22, defect 5): the lock every writing command takes on its tree.

Two commands are started on one tree, deterministically: the first runs under a small driver that
stops it, its lock taken, at the point it would start changing the tree (``PAUSED_DRIVER``); once it
is there, the second runs to its end; then the first is let go. Exactly one of the two may change
the tree: the second is refused in one line naming the first, and leaves every file as it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, SAMPLE_PARQUET, finepdfs_row, stored_ids, tree_hashes

from pipelines import cli
from shards import layout
from shards.removal.lists import REMOVALS_NAME, read_log

LOCK_NAME = ".pretokenize-lock"  # the name the tree's lock has (shards.lock.LOCK_NAME)
RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document about locks. " * (3 + i % 9)) for i in range(40)]

# Runs `pretokenize ARGS...`, but stops at TARGET (module:attribute, called once the command holds its
# lock and before it changes the tree) until the file GO exists; PAUSED is created once it is there.
PAUSED_DRIVER = """
import importlib, os, sys, time
go, paused, target = sys.argv[1:4]
module, _, attr = target.partition(":")
owner = importlib.import_module(module)
*path, name = attr.split(".")
for part in path:
    owner = getattr(owner, part)
real = getattr(owner, name)
def paused_here(*args, **kwargs):
    open(paused, "w").close()
    while not os.path.exists(go):
        time.sleep(0.05)
    return real(*args, **kwargs)
setattr(owner, name, paused_here)
from pipelines import cli
sys.exit(cli.main(sys.argv[4:]))
"""
PIPELINE_RUN = "apache_beam.pipeline:Pipeline.run"  # bucketed, remove, train-bpe: the tree is claimed, the job not run


@pytest.fixture
def out(tree_copy):
    return tree_copy


class Paused:
    """A command stopped at its target, holding its lock."""

    def __init__(self, args: list[str], target: str, tmp_path):
        self.go, paused = tmp_path / "go", tmp_path / "paused"
        self.proc = subprocess.Popen([sys.executable, "-c", PAUSED_DRIVER, str(self.go), str(paused), target, *args],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 180
        while not paused.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out, err = self.proc.communicate(timeout=60)
                pytest.fail(f"the first command ended before it was paused: {self.proc.returncode}\n{out}\n{err}")
            time.sleep(0.05)

    def finish(self) -> tuple[int, str, str]:
        self.go.touch()
        out, err = self.proc.communicate(timeout=300)
        return self.proc.returncode, out, err


def pretokenize(*args) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def files(tree) -> dict[str, str]:
    return tree_hashes(tree, skip=(LOCK_NAME,))


_PROGRESS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO (transforms|pipelines)[.\w]*: ")


def assert_refused(result, job: str, holder: str) -> None:
    """Exit 2, one line naming the holder (its command, host, pid, start time), no traceback."""
    code, _, err = result
    assert code == 2, err
    # Only the launch's progress lines (the tokenizer loaded, the input planned) may come before it.
    lines = [line for line in err.strip().splitlines() if not _PROGRESS.match(line)]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"pretokenize {job}: ") and "is locked by another command, `pretokenize " + holder in line
    assert " (host " in line and ", pid " in line and ", started " in line, line
    assert "nothing was changed" in line


def write_list(path, ids) -> str:
    path.write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return str(path)


def assert_verifies(tree) -> None:
    code, printed, err = pretokenize("verify", "--output", tree, *RUNNER)
    assert code == 0, printed + err
    assert "is locked by" not in printed
    assert not (tree / LOCK_NAME).exists()


def removal_args(tree, removal_list) -> list[str]:
    return ["remove", "--output", str(tree), "--removal-list", removal_list, *RUNNER]


def test_remove_and_remove(out, tmp_path):
    first_ids, second_ids = stored_ids(out)[:2], stored_ids(out)[5:7]
    first = Paused(removal_args(out, write_list(tmp_path / "a.txt", first_ids)), PIPELINE_RUN, tmp_path)
    before = files(out)
    assert_refused(pretokenize(*removal_args(out, write_list(tmp_path / "b.txt", second_ids))), "remove", "remove")
    assert files(out) == before
    code, _, err = first.finish()
    assert code == 0, err
    assert_verifies(out)
    assert set(list(read_log(str(out / REMOVALS_NAME)).ids)) == set(first_ids)
    # The refused removal, asked again, is accepted; every line accepted before stays.
    assert pretokenize(*removal_args(out, str(tmp_path / "b.txt")))[0] == 0
    assert set(list(read_log(str(out / REMOVALS_NAME)).ids)) == set(first_ids + second_ids)
    assert_verifies(out)


@pytest.mark.parametrize("first_job", ["remove", "bucketed"])
def test_remove_and_a_bucketed_rerun(first_job, out, source, tmp_path):
    flagged = stored_ids(out)[3:5]
    rerun = ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", *RUNNER]
    remove = removal_args(out, write_list(tmp_path / "flagged.txt", flagged))
    first_args, second_args = (remove, rerun) if first_job == "remove" else (rerun, remove)
    first = Paused(first_args, PIPELINE_RUN, tmp_path)
    before = files(out)
    assert_refused(pretokenize(*second_args), second_args[0], first_job)
    assert files(out) == before
    code, _, err = first.finish()
    assert code == 0, err
    assert_verifies(out)
    if first_job == "bucketed":  # the refused removal, asked again now
        assert pretokenize(*remove)[0] == 0
    assert set(list(read_log(str(out / REMOVALS_NAME)).ids)) == set(flagged)
    assert not set(flagged) & set(stored_ids(out))
    # A later re-run keeps every accepted removal.
    assert pretokenize(*rerun)[0] == 0
    assert set(list(read_log(str(out / REMOVALS_NAME)).ids)) == set(flagged)
    assert not set(flagged) & set(stored_ids(out))
    assert_verifies(out)


def test_bucketed_and_bucketed_into_a_new_output(source, tmp_path):
    out = tmp_path / "new"
    args = ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", *RUNNER]
    first = Paused(args, PIPELINE_RUN, tmp_path)
    before = files(out)
    assert_refused(pretokenize(*args), "bucketed", "bucketed")
    assert files(out) == before
    code, _, err = first.finish()
    assert code == 0, err
    assert_verifies(out)


def test_export_and_stats(out, tmp_path):
    first = Paused(["export", "megatron", "--output", str(out)], "pipelines.export:export_megatron", tmp_path)
    before = files(out)
    assert_refused(pretokenize("stats", "--output", out, "--png", "none"), "stats", "export")
    assert files(out) == before
    code, _, err = first.finish()
    assert code == 0, err
    assert pretokenize("export", "megatron", "--output", out, "--check")[0] == 0
    assert_verifies(out)


def test_remove_and_export(out, tmp_path):
    flagged = stored_ids(out)[:1]
    first = Paused(removal_args(out, write_list(tmp_path / "flagged.txt", flagged)), PIPELINE_RUN, tmp_path)
    before = files(out)
    assert_refused(pretokenize("export", "megatron", "--output", out), "export", "remove")
    assert files(out) == before
    code, _, err = first.finish()
    assert code == 0, err
    assert set(list(read_log(str(out / REMOVALS_NAME)).ids)) == set(flagged)
    assert_verifies(out)


def test_train_bpe_and_train_bpe(tmp_path):
    out = tmp_path / "tok"
    args = ["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--merges", "20", *RUNNER]
    first = Paused(args, PIPELINE_RUN, tmp_path)
    before = files(out)
    assert_refused(pretokenize(*args), "train-bpe", "train-bpe")
    assert files(out) == before
    code, _, err = first.finish()
    assert code == 0, err
    assert (out / "training_stats.txt").exists() and not (out / LOCK_NAME).exists()
    assert not (out / layout.TEMP_DIR_NAME).exists()


def test_a_holder_killed_with_sigkill_is_found_dead_and_the_next_run_proceeds(out, tmp_path):
    flagged = stored_ids(out)[:2]
    args = removal_args(out, write_list(tmp_path / "flagged.txt", flagged))
    first = Paused(args, PIPELINE_RUN, tmp_path)
    assert (out / LOCK_NAME).exists()
    first.proc.send_signal(signal.SIGKILL)
    first.proc.communicate(timeout=60)
    assert (out / LOCK_NAME).exists()  # a kill -9 runs no cleanup
    code, _, err = pretokenize(*args)
    assert code == 0, err
    freed = [line for line in err.splitlines() if "freed the lock of" in line]
    assert len(freed) == 1 and f"pid {first.proc.pid}," in freed[0], err
    assert "that process is no longer running on this host" in freed[0]
    assert set(list(read_log(str(out / REMOVALS_NAME)).ids)) == set(flagged)
    assert_verifies(out)


def _lock_file(tree, host: str = "elsewhere.example", expired: bool = False, pid: int = 4242) -> None:
    """A lock as another command on ``host`` writes it; ``expired``: it stopped renewing an hour ago."""
    now = time.time()
    stamp = now - 3600 if expired else now
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    (tree / LOCK_NAME).write_text(json.dumps({
        "host": host, "boot_id": "", "pid": pid, "command": "pretokenize remove --output elsewhere",
        "started": time.strftime(fmt, time.gmtime(stamp - 60)),
        "expires": time.strftime(fmt, time.gmtime(stamp + 90)), "lease_seconds": 90, "token": "0" * 32,
    }))
    os.utime(tree / LOCK_NAME, (stamp, stamp))


def stats_of(tree, *flags) -> list[str]:
    return ["stats", "--output", str(tree), "--png", "none", *flags]


def test_a_lease_renewed_elsewhere_is_respected_and_an_expired_one_is_taken_over(out, capsys):
    _lock_file(out)
    before = files(out)
    assert cli.main(stats_of(out)) == 2
    line = capsys.readouterr().err.strip()
    assert "locked by another command, `pretokenize remove --output elsewhere` (host elsewhere.example, " in line
    assert "pid 4242, started " in line
    assert files(out) == before and (out / LOCK_NAME).exists()

    _lock_file(out, expired=True)
    assert cli.main(stats_of(out)) == 0
    err = capsys.readouterr().err
    assert "took over the lock of `pretokenize remove --output elsewhere` (host elsewhere.example" in err
    assert "its lease expired at" in err and not (out / LOCK_NAME).exists()
    assert (out / "length_stats.txt").exists()


def test_a_live_holder_on_this_host_is_respected(out, capsys):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        from shards.lock import _boot_id

        _lock_file(out, host=socket.gethostname(), pid=sleeper.pid)
        (out / LOCK_NAME).write_text((out / LOCK_NAME).read_text().replace('"boot_id": ""',
                                                                            f'"boot_id": "{_boot_id()}"'))
        assert cli.main(stats_of(out)) == 2
        assert f"pid {sleeper.pid}," in capsys.readouterr().err
        sleeper.kill()
        sleeper.wait()
        assert cli.main(stats_of(out)) == 0
        assert "that process is no longer running on this host" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()


def test_break_lock_takes_a_live_lock_and_says_what_it_broke(out, capsys):
    _lock_file(out)
    assert cli.main(stats_of(out, "--break-lock")) == 0
    err = capsys.readouterr().err
    assert "broke the lock held by `pretokenize remove --output elsewhere` (host elsewhere.example, pid 4242" in err
    assert not (out / LOCK_NAME).exists()


def test_a_lock_file_that_is_not_ours_is_refused_and_broken_only_on_request(out, capsys):
    (out / LOCK_NAME).write_text("not json\n")
    assert cli.main(stats_of(out)) == 2
    assert "is not a lock this tool wrote" in capsys.readouterr().err
    assert (out / LOCK_NAME).read_text() == "not json\n"
    assert cli.main(stats_of(out, "--break-lock")) == 0
    assert "broke a lock file that is not a lock this tool wrote" in capsys.readouterr().err


def test_the_lock_is_freed_on_error_and_on_success(out, tmp_path, capsys, monkeypatch):
    from pipelines import remove
    from shards import lock

    seen = []
    real_prepare = remove.prepare

    def prepare(options, **kwargs):  # what remove does next, once it holds the lock
        seen.append(lock.holder(str(out)).holder.command)
        return real_prepare(options, **kwargs)

    monkeypatch.setattr(remove, "prepare", prepare)
    # An error after the lock was taken (a removal list that does not exist).
    args = removal_args(out, str(tmp_path / "missing.txt"))
    assert cli.main(args) == 2
    assert seen == ["pretokenize " + " ".join(args)] and not (out / LOCK_NAME).exists()
    assert cli.main(["export", "megatron", "--output", str(out)]) == 0
    assert not (out / LOCK_NAME).exists() and lock.holder(str(out)) is None


def test_ctrl_c_frees_the_lock(out, source, tmp_path):
    args = ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", *RUNNER]
    first = Paused(args, PIPELINE_RUN, tmp_path)
    assert (out / LOCK_NAME).exists()
    first.proc.send_signal(signal.SIGINT)
    _, err = first.proc.communicate(timeout=120)
    assert first.proc.returncode == 2 and "pretokenize bucketed: interrupted" in err, err
    assert not (out / LOCK_NAME).exists()


def test_verify_says_when_a_writer_holds_the_tree_and_takes_no_lock(out, capsys):
    from shards import lock

    with lock.scope("pretokenize remove --output here"):
        lock.take(str(out))
        assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0
        printed = capsys.readouterr().out
    said = [line for line in printed.splitlines() if "is locked by" in line]
    assert len(said) == 1, printed
    assert said[0].startswith(f"verify: {out} is locked by `pretokenize remove --output here` (host ")
    assert f"pid {os.getpid()}," in said[0] and "a writer is changing it now" in said[0]
    assert not (out / LOCK_NAME).exists()


def test_the_heartbeat_renews_the_lease_and_a_lock_taken_away_is_not_deleted(out):
    from shards import lock

    with lock.scope("pretokenize test") as held:
        taken = lock.take(str(out), lease_seconds=0.4)
        first = lock.holder(str(out)).expiry()
        time.sleep(0.5)  # past the first lease: the heartbeat renewed it
        again = lock.holder(str(out))
        assert again.expiry() > first and again.expiry() > time.time()
        assert lock.why_free(again, break_lock=False) is None
        # Another command takes the lock (broken): the renewal notices, and release leaves it alone.
        other = lock.Holder.new("pretokenize other").to_json()
        (out / LOCK_NAME).unlink()
        (out / LOCK_NAME).write_bytes(other)
        assert taken.renew() is False and taken.lost
        assert list(held.held) == [str(out)]
    assert (out / LOCK_NAME).read_bytes() == other


def test_a_new_output_is_locked_before_it_is_claimed_and_left_as_found_when_refused(source, tmp_path, capsys):
    from shards import lock

    out = tmp_path / "fresh"
    with lock.scope("pretokenize bucketed --output fresh"):
        lock.take(str(out), make_root=True)
        args = ["bucketed", "--input", str(source), "--output", str(out), *RUNNER]
        assert cli.main(args) == 2
        assert "is locked by another command" in capsys.readouterr().err
        assert os.listdir(out) == [LOCK_NAME]  # no ownership record was written by the refused run
    assert not out.exists()  # the lock made the directory, and it was left empty


def test_a_gcs_lock_is_created_with_if_generation_match_0(monkeypatch):
    """No GCS server here: the request gcsfs sends for the lock's create is checked for its
    precondition, and a 412 answer is read as "held"."""
    gcsfs = pytest.importorskip("gcsfs", reason="gcsfs is in the gcp extra")
    from shards import lock

    calls = []

    async def call(self, method, path, *args, **kwargs):
        calls.append((method, path, kwargs))
        if len(calls) > 1:
            raise FileExistsError(path)  # what gcsfs raises for a 412 (gcsfs.retry.validate_response)
        return {"name": "out/.pretokenize-lock", "size": "10", "bucket": "b", "generation": "1"}

    monkeypatch.setattr(gcsfs.GCSFileSystem, "_call", call)
    monkeypatch.setattr(gcsfs.GCSFileSystem, "_write_file_cache_update", lambda *a, **k: _none(), raising=False)
    store = lock._store("gs://b/out")
    store.fs.consistency = "none"
    store.create(b"{}")
    method, path, kwargs = calls[0]
    assert method == "POST" and path.endswith("/upload/storage/v1/b/b/o")
    assert kwargs.get("ifGenerationMatch") == "0" and kwargs.get("uploadType") == "multipart"
    with pytest.raises(FileExistsError):
        store.create(b"{}")


async def _none():
    return None


def test_a_submit_only_launch_says_it_cannot_hold_the_lock_for_the_jobs_life(source, tmp_path, capsys):
    """A Flex Template's launcher returns once the runner has the job (``wait=False``): it
    frees the lock then, and says so. (Here the FnApiRunner runs the job inside run(), so the
    tree is finished by the time the launcher returns; on Dataflow it would still be running.)"""
    from pipelines import bucketed

    out = tmp_path / "out"
    args = ["--input", str(source), "--output", str(out), "--partitions", "2", *RUNNER]
    assert bucketed.run(args, wait=False) is None
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == (f"warning: the job outlives this launcher, which frees its lock on {out} now: until "
                           f"{layout.STATS_NAME} appears, start no other command that writes there")
    assert not (out / LOCK_NAME).exists()


def test_a_symlink_or_a_directory_at_the_locks_name_is_never_followed(out, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    (out / LOCK_NAME).symlink_to(victim)
    assert cli.main(stats_of(out)) == 2
    assert f"{LOCK_NAME} is not a file (a symbolic link); if no pretokenize command" in capsys.readouterr().err
    assert cli.main(stats_of(out, "--break-lock")) == 0  # the link goes, never its target
    assert not os.path.lexists(out / LOCK_NAME) and victim.read_text() == "not yours\n"
    (out / LOCK_NAME).mkdir()
    (out / LOCK_NAME / "keep.txt").write_text("mine\n")
    assert cli.main(stats_of(out, "--break-lock")) == 2  # a directory is never a lock, never removed
    assert "is not a file (a directory): the tool removes no directory" in capsys.readouterr().err
    assert (out / LOCK_NAME / "keep.txt").read_text() == "mine\n"


def test_a_lock_that_cannot_be_freed_costs_the_command_nothing_but_a_warning(out, monkeypatch, capsys):
    from shards import lock

    def unreachable(self, version):
        raise ConnectionError("the disk went away")

    monkeypatch.setattr(lock._LocalStore, "remove", unreachable)
    assert cli.main(stats_of(out)) == 0  # its work was done: the lock left is freed by the next command
    assert "could not free the lock of" in capsys.readouterr().err and (out / "length_stats.txt").exists()
    monkeypatch.undo()
    left = lock.holder(str(out)).holder
    assert left.pid == os.getpid() and left.command.startswith("pretokenize stats")  # freed once this process ends


# Only the exact lock name, holding this tool's holder record, is the tool's in a directory without a tree.
def test_a_user_file_named_like_the_lock_makes_a_directory_not_ours(source, tmp_path, capsys):
    userdir = tmp_path / "userdir"
    userdir.mkdir()
    (userdir / f"{LOCK_NAME}.notes").write_text("notes\n")
    assert cli.main(["bucketed", "--input", str(source), "--output", str(userdir), *RUNNER]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "is not empty and was not written by pretokenize" in err.strip().splitlines()[-1]
    assert sorted(os.listdir(userdir)) == [f"{LOCK_NAME}.notes"]


@pytest.mark.parametrize("flags", [[], ["--break-lock"]])
def test_a_lock_named_file_that_is_no_lock_is_a_users_and_break_lock_keeps_it(source, tmp_path, capsys, flags):
    userdir = tmp_path / "userdir2"
    userdir.mkdir()
    (userdir / LOCK_NAME).write_text('{"mine":1}\n')
    assert cli.main(["bucketed", "--input", str(source), "--output", str(userdir), *flags, *RUNNER]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(userdir) in err.strip().splitlines()[-1]
    assert sorted(os.listdir(userdir)) == [LOCK_NAME] and (userdir / LOCK_NAME).read_text() == '{"mine":1}\n'


# Issue 35, case 6: a live holder stopped (Ctrl-Z, a paused VM) past its lease keeps its lock on its
# host; a holder whose lock was taken (here broken with --break-lock) stops before its next write.
SHORT_LEASE = {**os.environ, "PRETOKENIZE_LOCK_LEASE_SECONDS": "1"}


class Stopped(Paused):
    """A command paused at its target holding its lock with a 1 s lease, then stopped (SIGSTOP)
    for three leases: it has not renewed since."""

    def __init__(self, args: list[str], target: str, tmp_path):
        self.go, paused = tmp_path / "go", tmp_path / "paused"
        self.proc = subprocess.Popen([sys.executable, "-c", PAUSED_DRIVER, str(self.go), str(paused), target, *args],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=SHORT_LEASE)
        deadline = time.monotonic() + 180
        while not paused.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out, err = self.proc.communicate(timeout=60)
                pytest.fail(f"the first command ended before it was paused: {self.proc.returncode}\n{out}\n{err}")
            time.sleep(0.05)
        os.kill(self.proc.pid, signal.SIGSTOP)
        time.sleep(3.0)

    def finish(self) -> tuple[int, str, str]:
        self.go.touch()
        os.kill(self.proc.pid, signal.SIGCONT)
        return super().finish()

    def kill(self) -> None:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def bucketed_args(source, tree) -> list[str]:
    return ["bucketed", "--input", str(source), "--output", str(tree), "--partitions", "2", *RUNNER]


def test_a_stopped_holder_past_its_lease_keeps_its_lock_on_its_host(out, source, tmp_path):
    first = Stopped(bucketed_args(source, out), PIPELINE_RUN, tmp_path)
    try:
        held = json.loads((out / LOCK_NAME).read_text())
        assert held["pid"] == first.proc.pid and held["pid_started"]
        before = files(out)
        ids = stored_ids(out)[:2]
        assert_refused(pretokenize(*removal_args(out, write_list(tmp_path / "a.txt", ids))), "remove", "bucketed")
        assert files(out) == before
    finally:
        code, _, err = first.finish()
    assert code == 0, err
    assert_verifies(out)
    assert set(ids) <= set(stored_ids(out))  # the refused removal changed nothing


def test_a_reused_pid_is_not_the_holder(out, capsys):
    """A lock naming this host, a running pid, and another start time: that pid now names another
    process, so the holder is gone."""
    import socket

    from shards.lock import _boot_id

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock_file(out, host=socket.gethostname(), pid=sleeper.pid)
        held = json.loads((out / LOCK_NAME).read_text())
        (out / LOCK_NAME).write_text(json.dumps({**held, "boot_id": _boot_id(), "pid_started": "1"}))
        assert cli.main(stats_of(out)) == 0
        assert "that process is no longer running on this host" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_holder_whose_lock_was_taken_stops_before_its_next_write(out, source, tmp_path):
    first = Stopped(bucketed_args(source, out), PIPELINE_RUN, tmp_path)
    try:
        ids = stored_ids(out)[:2]
        code, _, err = pretokenize(*removal_args(out, write_list(tmp_path / "a.txt", ids)), "--break-lock")
        assert code == 0, err
        assert "broke the lock held by `pretokenize bucketed " in err
        after_removal = files(out)
    except BaseException:
        first.kill()
        raise
    code, _, err = first.finish()
    assert code == 2, err
    # Its one line, after its launch's and progress's (and the libraries' the driver imports before the CLI's logging).
    lines = [line for line in err.strip().splitlines() if line.startswith("pretokenize")]
    assert len(lines) == 1 and "Traceback" not in err and " WARNING " not in err, err
    assert lines[0].startswith(f"pretokenize: {out}: this command's lock was taken by ")
    assert "it stops here and writes nothing more there" in lines[0]
    assert files(out) == after_removal  # the tree is the removal's, byte for byte
    assert not set(ids) & set(stored_ids(out))
    assert_verifies(out)


def test_a_holder_in_another_pid_namespace_of_this_host_keeps_a_live_lease(out, capsys):
    """Two containers of one host (--network host: the host's name; one kernel: one boot id), each
    in its own PID namespace: the holder's pid means nothing in the other's. A lease it renews
    keeps its lock; only an expired one is taken over."""
    import socket

    from shards.lock import _boot_id

    for expired in (False, True):
        _lock_file(out, host=socket.gethostname(), pid=2 ** 22 + 7, expired=expired)  # no such pid here
        held = json.loads((out / LOCK_NAME).read_text())
        stamp = (out / LOCK_NAME).stat().st_mtime
        (out / LOCK_NAME).write_text(json.dumps({**held, "boot_id": _boot_id(), "pid_started": "12345",
                                                 "pid_ns": "pid:[1]"}))
        os.utime(out / LOCK_NAME, (stamp, stamp))
        before = files(out)
        if not expired:
            assert cli.main(stats_of(out)) == 2
            assert "locked by another command" in capsys.readouterr().err
            assert files(out) == before
        else:
            assert cli.main(stats_of(out)) == 0
            assert "its lease expired" in capsys.readouterr().err


def test_a_holder_woken_from_a_suspend_past_its_lease_stops_before_its_next_write(out, monkeypatch):
    """A machine suspended (a laptop's lid closed) past the lease: another host took the lock over.
    On waking, the next write asks the store first, though time.monotonic did not count the sleep."""
    from shards import lock

    awake = [time.clock_gettime(time.CLOCK_BOOTTIME)]
    real = time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime",
                        lambda clock: awake[0] if clock == time.CLOCK_BOOTTIME else real(clock))
    with lock.scope("pretokenize test"):
        lock.take(str(out), lease_seconds=60)
        lock.guard(str(out))  # held: a write may go on
        (out / LOCK_NAME).unlink()  # the lease expired while it slept: another host's command took it
        (out / LOCK_NAME).write_bytes(lock.Holder.new("pretokenize other").to_json())
        awake[0] += 3600  # an hour asleep; the monotonic clock saw none of it
        with pytest.raises(lock.LockLost, match="this command's lock was taken by `pretokenize other`"):
            lock.guard(str(out))


def test_a_rewrite_whose_lock_was_taken_during_its_copy_leaves_the_shard(out, tmp_path, monkeypatch):
    """remove stopped in the middle of copying a shard past its lease: the command that took the
    lock over finished the removal, and may have changed the shard since. The copy, once woken,
    is not moved over the shard: the rewrite asks its lock again before it replaces the file."""
    import hashlib

    from pipelines.remove import RemoveSettings, prepare
    from shards import lock
    from shards.removal import rewrite

    settings = RemoveSettings(str(out), write_list(tmp_path / "a.txt", stored_ids(out)[:1]))
    awake = [time.clock_gettime(time.CLOCK_BOOTTIME)]
    real_clock, real_sha256 = time.clock_gettime, hashlib.sha256

    class TakenMidCopy:  # the digest of the copy: the lock is taken over while the copy runs
        def __init__(self):
            self.digest = real_sha256()

        def update(self, chunk):
            if (out / LOCK_NAME).read_bytes() != other:
                (out / LOCK_NAME).unlink()
                (out / LOCK_NAME).write_bytes(other)
                awake[0] += 3600
            self.digest.update(chunk)

        def hexdigest(self):
            return self.digest.hexdigest()

    other = lock.Holder.new("pretokenize other").to_json()
    with lock.scope("pretokenize remove"):
        lock.take(str(out), lease_seconds=60)
        plan = prepare(settings)
        shard = out / plan.files[0].rel_path
        before = shard.read_bytes()
        monkeypatch.setattr(time, "clock_gettime",
                            lambda clock: awake[0] if clock == time.CLOCK_BOOTTIME else real_clock(clock))
        monkeypatch.setattr(rewrite.hashlib, "sha256", TakenMidCopy)
        with pytest.raises(lock.LockLost):
            rewrite.rewrite_file(str(out), plan.file_plan(0), 4)
    assert shard.read_bytes() == before


def test_a_log_written_while_the_lock_was_taken_does_not_replace_the_tree_s(out, tmp_path, monkeypatch):
    """removals.txt (or the manifest) streamed by a command stopped past its lease while the one
    that took the lock over added its own lines: the stale copy is not moved over the new log."""
    from shards import lock
    from shards.removal import journal

    awake = [time.clock_gettime(time.CLOCK_BOOTTIME)]
    real_clock = time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime",
                        lambda clock: awake[0] if clock == time.CLOCK_BOOTTIME else real_clock(clock))
    log_before = (out / REMOVALS_NAME).read_bytes() if (out / REMOVALS_NAME).exists() else None

    def chunks():
        yield "a stale line\n"
        (out / LOCK_NAME).unlink()  # stopped here past its lease: another command took the lock over
        (out / LOCK_NAME).write_bytes(lock.Holder.new("pretokenize other").to_json())
        awake[0] += 3600
        yield "another stale line\n"

    with lock.scope("pretokenize remove"):
        lock.take(str(out), lease_seconds=60)
        with pytest.raises(lock.LockLost):
            journal.write_streamed(str(out), REMOVALS_NAME, chunks(), "removal log")
    after = (out / REMOVALS_NAME).read_bytes() if (out / REMOVALS_NAME).exists() else None
    assert after == log_before
