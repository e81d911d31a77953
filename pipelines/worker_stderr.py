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
the pipe except the records Python's default format prints (``LEVEL:logger:message``) below ERROR;
the rest (an error, a traceback, a C library's message) is shown as the worker wrote it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

# Python's BASIC_FORMAT: "%(levelname)s:%(name)s:%(message)s".
_HARNESS_RECORD = re.compile(rb"^(?:DEBUG|INFO|WARNING):[\w.]+:")


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


def _on_descriptor_2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both
        return False


def _pass_on(read_end: int, original: int) -> None:
    """Copies every line read from the pipe to ``original`` (a descriptor of its own, which it
    closes) but the harness records, until the last worker has closed the pipe."""
    with open(read_end, "rb", buffering=0) as pipe, open(original, "wb", buffering=0) as out:
        original = out.fileno()
        pending = b""
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not harness_line(line))
            if kept:
                with contextlib.suppress(OSError):
                    os.write(original, kept)
        if pending and not harness_line(pending):
            with contextlib.suppress(OSError):
                os.write(original, pending)
