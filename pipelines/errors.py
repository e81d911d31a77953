"""How a job's failures are said: a launch's errors as one-line UsageErrors, a run that failed or
was interrupted as a RunStopped saying what the output holds, a full disk found in any error.
"""

from __future__ import annotations

import contextlib
import errno
import re
import signal
import threading

from shards.storage import Unreachable
from transforms.core.records import BadInputError, UsageError


@contextlib.contextmanager
def launching():
    """Errors of the launch (settings checked, input planned, output prepared) as UsageErrors;
    bad input found there stays a BadInputError."""
    try:
        yield
    except (UsageError, BadInputError):
        raise
    except (ValueError, OSError, ImportError) as e:
        raise UsageError(str(e) or type(e).__name__) from e


class RunStopped(Exception):
    """A run that failed or was interrupted, said in one line: what happened and what the output
    holds now. The run's temporary files are gone by the time it is raised, but the work of the
    input units it finished (transforms.run.resume), which the line mentions."""


# A store a worker could not reach: "cannot reach URL: connection failed: ..." (storage.reaching).
_UNREACHABLE = re.compile(re.escape(Unreachable.PREFIX)
                          + r"(\S+: (?:connection failed|access refused|the store failed).+?)"
                          r"(?: \[while running |\\n|\n|$)")
_NO_SPACE = re.compile(r"\[Errno 28\] No space left on device(?:: '([^']*)')?")


def no_space_message(error: BaseException) -> str | None:
    """'no space left on device (writing PATH)' when a full disk is behind ``error``, even inside a
    runner's error text."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            where = f" writing {error.filename}" if error.filename else ""
            return f"no space left on device{where}"
        m = _NO_SPACE.search(str(error))
        if m:
            return "no space left on device" + (f" writing {m.group(1)}" if m.group(1) else "")
        error = error.__cause__ or error.__context__
    return None


def unreachable_message(error: BaseException) -> str | None:
    """The one line of a store that could not be reached (storage.Unreachable) inside ``error``,
    even when a runner has wrapped it in its own error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        # The text, even of an Unreachable: a runner may raise it again with its step appended.
        m = _UNREACHABLE.search(str(error))
        if m:
            return Unreachable.PREFIX + m.group(1)
        if isinstance(error, Unreachable):
            return str(error)
        error = error.__cause__ or error.__context__
    return None


def stopped_line(error: BaseException, output: str, interrupted: bool, state: str) -> RunStopped | None:
    """What a run that stopped says in one line, what stopped it (Ctrl-C, a full disk, a store it
    could not reach) and then ``state``, what ``output`` holds now; None for any other error, which
    is raised as it is."""
    if interrupted:
        return RunStopped(f"interrupted; {state}")
    full = no_space_message(error)
    if full is not None:
        return RunStopped(f"{full} ({output}); {state}")
    unreachable = unreachable_message(error)
    if unreachable is not None:
        return RunStopped(f"{unreachable}; {state}")
    return None


@contextlib.contextmanager
def noting_interrupts(noted: list):
    """Ctrl-C still raises KeyboardInterrupt, but is also noted in ``noted``: a runner may turn the
    exception into its own error (RuntimeError: KeyboardInterrupt [while running ...])."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum, frame):
        noted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# A runner may keep only the text of a worker's exception: "bad input: FILE: PROBLEM [while running
# 'Step']", perhaps inside the repr of another error. The message ends at the runner's suffix, a
# line break, or the end of the text.
_BAD_INPUT = re.compile(re.escape(BadInputError.PREFIX) + r"(.+?)(?: \[while running |\\n|\n|$)")


def bad_input_message(error: BaseException) -> str | None:
    """The bad-input message inside ``error``, even when a runner has wrapped it in its own error."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    for e in chain:  # the error itself, when it travelled as an object
        if isinstance(e, BadInputError):
            return str(e)
    for e in chain:  # else its text, inside a runner's error
        m = _BAD_INPUT.search(str(e))
        if m:
            return BadInputError.PREFIX + m.group(1)
    return None

