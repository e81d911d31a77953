"""Failures on purpose, from outside the production code.

In-process tests patch a DoFn with ``fail_first``; tests that run a job in a subprocess (to kill
it) start it through this file, which patches the process and then runs the CLI:

    python tests/faults.py --publish-delay 0.05 -- bucketed --input ... --output ...
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path


def fail_first(monkeypatch, cls, method: str, times: int, counter: collections.Counter, name: str) -> None:
    """The first ``times`` calls of ``cls.method`` (a DoFn's generator method) in this process fail
    after producing their first output, as a worker that crashes mid-bundle would. ``counter[name]``
    counts the failures."""
    original = getattr(cls, method)

    @functools.wraps(original)
    def failing(self, *args, **kwargs):
        outputs = original(self, *args, **kwargs)
        if counter[name] >= times:
            yield from outputs or ()
            return
        for value in outputs or ():
            yield value
            break
        counter[name] += 1
        raise RuntimeError(f"injected failure #{counter[name]} in {name}")

    monkeypatch.setattr(cls, method, failing)


def slow_publish(seconds: float) -> None:
    """Each staged file moved into place waits ``seconds`` afterwards, so a test can kill the job
    in the middle of publishing."""
    from fsspec.implementations.local import LocalFileSystem

    move = LocalFileSystem.mv

    def mv(self, src, dst, *args, **kwargs):
        result = move(self, src, dst, *args, **kwargs)
        if "/staged/" in str(src):
            time.sleep(seconds)
        return result

    LocalFileSystem.mv = mv


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--publish-delay", type=float, default=0.0)
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    if args.publish_delay:
        slow_publish(args.publish_delay)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipelines import cli

    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
