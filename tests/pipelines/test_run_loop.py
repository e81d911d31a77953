"""The one run loop of every command that runs a pipeline (pipelines.job.stopping, wait_for) and the
one line a stopped run says (pipelines.errors.stopped_line)."""

from __future__ import annotations

import errno
import os

import pytest

from pipelines import train_bpe
from pipelines.errors import RunStopped, stopped_line
from pipelines.job import stopping, wait_for
from shards.storage import Unreachable
from transforms.core.records import UsageError

UNREACHABLE = Unreachable("cannot reach s3://bucket/out: connection failed: refused")
FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/x.npy")


def _stop(calls: list):
    def on_stop(error, interrupted):
        calls.append((type(error).__name__, interrupted))
        return stopped_line(error, "out/", interrupted, "the previous output is intact")
    return on_stop


@pytest.mark.parametrize(("error", "line"), [
    (KeyboardInterrupt(), "interrupted; the previous output is intact"),
    (FULL, "no space left on device writing /out/x.npy (out/); the previous output is intact"),
    (RuntimeError(f"worker said: {UNREACHABLE} [while running 'Write']"),
     "cannot reach s3://bucket/out: connection failed: refused; the previous output is intact"),
])
def test_a_stopped_run_is_one_line_saying_what_stopped_it_and_what_the_output_holds(error, line):
    calls: list = []
    with pytest.raises(RunStopped) as e, stopping(_stop(calls)):
        raise error
    assert str(e.value) == line and len(calls) == 1


def test_any_other_error_is_raised_as_it_is_after_on_stop_and_a_dry_runs_without_it():
    calls: list = []
    with pytest.raises(RuntimeError, match="a bug"), stopping(_stop(calls)):
        raise RuntimeError("a bug")
    assert calls == [("RuntimeError", False)]
    with pytest.raises(KeyboardInterrupt), stopping(_stop(calls), dry_run=True):
        raise KeyboardInterrupt
    with pytest.raises(UsageError), stopping(_stop(calls), passing=(UsageError,)):
        raise UsageError("a flag")
    assert len(calls) == 1  # a dry run's error and a passing one never reach on_stop


def test_ctrl_c_while_waiting_cancels_the_job():
    class Result:
        cancelled = False

        def wait_until_finish(self):
            raise KeyboardInterrupt

        def cancel(self):
            self.cancelled = True

    result = Result()
    with pytest.raises(KeyboardInterrupt):
        wait_for(result, [])
    assert result.cancelled


def test_train_bpe_says_an_unreachable_store_as_the_other_commands_do(tmp_path):
    line = train_bpe._stopped(str(tmp_path), "run-x", RuntimeError(str(UNREACHABLE)), False)
    assert str(line) == ("cannot reach s3://bucket/out: connection failed: refused; the previous tokenizer is "
                         "intact; the run's temporary files were deleted")
