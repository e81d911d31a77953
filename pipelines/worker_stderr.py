"""The standard error of a local run's worker processes, kept from the terminal as far as it is Beam's
harness logging to it.

The FnApiRunner in multi_processing mode (``--workers N``) starts each worker as
``python -m apache_beam.runners.worker.sdk_worker_main``, which inherits the launcher's standard
error. Importing Beam there without its GCP extra logs a warning through ``logging.warning``, which
gives the worker's root logger a handler on standard error (Python's ``basicConfig``); from then on
every record of the harness (``INFO:__main__:Logging handler created.``, ``Creating insecure control
channel``, ``Python sdk harness exiting``), and of this project's own steps, is printed there, in the
middle of the bars, besides reaching the launcher through Beam's logging service, where
transforms.core.progress shows this project's records once.

So, while such a run goes, the workers get a pipe as their standard error (the launcher's file
descriptor 2, which they inherit), and the launcher's own writes go to the terminal as before
(``sys.stderr`` is pointed at a copy of the original descriptor). A thread passes on every line of
the pipe except the records Python's default format prints (``LEVEL:logger:message``) below ERROR,
and Beam's reports of a failed step; the rest (another error, a traceback, a C library's message) is
shown as the worker wrote it.

A step that fails in a worker (bad input found there, say) reaches the launcher as the job's error,
which the command says in one line, as with one worker. The worker's harness has already reported it
on its standard error, three times with their tracebacks: Beam's ``apache_beam.runners`` loggers'
ERROR records and the traceback the harness prints itself, whose last exception names the step
(``[while running '...']``), with frames of Beam's DoFnRunner. Such a report is read whole (up
to a blank line that no chained traceback follows, or a line that cannot continue it: another
worker's, as the workers share the pipe) and kept back; any other report is passed on whole. Those loggers' records also
go to the launcher through Beam's logging service, where the launcher keeps Beam's own from the
terminal as it does in an in-process run (transforms.core.progress.show_worker_logs).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

# Python's BASIC_FORMAT: "%(levelname)s:%(name)s:%(message)s".
_HARNESS_RECORD = re.compile(rb"^(?:DEBUG|INFO|WARNING):[\w.]+:")
_RUNNER_ERROR = re.compile(rb"^ERROR:apache_beam\.runners\.[\w.]+:")
_TRACEBACK = b"Traceback (most recent call last):"
_CHAINED = (b"During handling of the above exception, another exception occurred:",
            b"The above exception was the direct cause of the following exception:")
_STEP_FAILED = b" [while running '"  # what Beam's DoFnRunner adds to the error of a failed step
# A frame of Beam's DoFnRunner: the traceback is of a step's failure, which reaches the launcher as the
# job's error. Two workers' reports longer than a pipe's atomic write interleave, so a part of one may
# be judged alone, without the line that names its step.
_STEP_FRAME = b"in apache_beam.runners.common.DoFnRunner."
_LONGEST_REPORT = 5000  # lines held at most: a report longer than this is passed on as it comes


def harness_line(line: bytes) -> bool:
    """Whether ``line`` is a record below ERROR that a worker's root handler printed."""
    return _HARNESS_RECORD.match(line) is not None


@contextlib.contextmanager
def filtering_worker_stderr(enabled: bool):
    """Worker processes started inside have their harness records kept from standard error."""
    if not enabled:
        yield
        return
    try:
        original = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no descriptor 2 to redirect (a host that closed it): nothing to filter
        yield
        return
    sys.stderr.flush()
    launcher_stderr = sys.stderr
    if _on_descriptor_2(launcher_stderr):  # else (a host's capture) this process's writes never reach the pipe
        # The descriptor is closed with the last reference to this file (a bar may keep one), never
        # while something may still write to it: a closed number is soon another file's.
        sys.stderr = open(os.dup(original), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    passer = threading.Thread(target=_pass_on, args=(read_end, os.dup(original)), name="pretokenize-worker-stderr",
                              daemon=True)
    os.dup2(write_end, 2)
    os.close(write_end)
    passer.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last write end is a worker's, once this process lets go of it
        os.close(original)  # only this function holds it: the file above and the thread have their own
        sys.stderr = launcher_stderr
        passer.join(timeout=5)  # a worker still alive keeps the pipe open: the thread is a daemon


class ErrorReports:
    """Sorts a worker's lines: a harness record below ERROR is dropped; an error report (a Beam
    runner's ERROR record or a traceback, with the lines that follow it up to its end) is held until
    it ends, then dropped when it is Beam's report of a failed step, else passed on whole."""

    def __init__(self):
        self._held: list[bytes] = []

    def feed(self, line: bytes) -> list[bytes]:
        """The lines to pass on now, ``line`` (with its newline) read last."""
        if not self._held:
            if _RUNNER_ERROR.match(line) or line.rstrip(b"\r\n") == _TRACEBACK:
                self._held = [line]
                return []
            return [] if harness_line(line) else [line]
        if harness_line(line):  # another worker's record, amid the report: dropped as anywhere
            return []
        ended = not self._held[-1].strip() and line.strip() and line.rstrip(b"\r\n") not in _CHAINED
        if ended or _foreign(self._held[-1], line) or len(self._held) >= _LONGEST_REPORT:
            return self.end() + self.feed(line)
        self._held.append(line)
        return []

    def end(self) -> list[bytes]:
        """The held report's lines to pass on, now that it has ended (or the pipe has)."""
        report, self._held = self._held, []
        failed_step = report and (_RUNNER_ERROR.match(report[0])
                                  or any(_STEP_FAILED in line or _STEP_FRAME in line for line in report))
        return [] if failed_step else report


def _foreign(previous: bytes, line: bytes) -> bool:
    """Whether ``line`` cannot continue the report whose last line is ``previous``: after a line
    that is not indented (a traceback's exception, a record's message), a line neither indented,
    blank, a traceback's or a chained one's heading, nor another runner ERROR record. The workers
    share the pipe: such a line is another worker's (a crash's message), never to be kept back
    with a failed step's report."""
    def plain(text: bytes) -> bool:
        return bool(text.strip()) and not text[:1].isspace()

    heading = line.rstrip(b"\r\n") in (_TRACEBACK, *_CHAINED) or _RUNNER_ERROR.match(line)
    return plain(previous) and previous.rstrip(b"\r\n") != _TRACEBACK and plain(line) and not heading


def _on_descriptor_2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both
        return False


def _pass_on(read_end: int, original: int) -> None:
    """Copies every line read from the pipe to ``original`` (a descriptor of its own, which it
    closes) but what ErrorReports keeps back, until the last worker has closed the pipe."""
    reports = ErrorReports()
    with open(read_end, "rb", buffering=0) as pipe, open(original, "wb", buffering=0) as out:
        original = out.fileno()
        pending = b""
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            _write(original, [kept for line in lines for kept in reports.feed(line + b"\n")])
        _write(original, (reports.feed(pending) if pending else []) + reports.end())


def _write(descriptor: int, lines: list[bytes]) -> None:
    if lines:
        with contextlib.suppress(OSError):
            os.write(descriptor, b"".join(lines))
