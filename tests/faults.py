"""Failures on purpose, from outside the production code.

In-process tests patch a DoFn with ``fail_first``; tests that run a job in a subprocess (to kill
it) start it through this file, which patches the process and then runs the CLI:

    python tests/faults.py --publish-delay 0.05 -- bucketed --input ... --output ...
    python tests/faults.py --marker-delay 0.5 --marker-note notes.txt -- scaffold --input ... --output ...
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


def slow_markers(seconds: float, note: str | None) -> None:
    """Before each unit's completion marker is written (its spill files are closed by then), append
    a line to the file ``note`` and wait ``seconds``: a test can count finished units and kill the job
    between a unit's files and its marker. Patched in this process, so for the in-process runner."""
    from shards import storage

    write = storage.write_atomic

    def write_atomic(url, data, scratch=None):
        if "/units/" in str(url):
            if note:
                with open(note, "a", encoding="utf-8") as f:
                    f.write(f"{url}\n")
            time.sleep(seconds)
        return write(url, data, scratch)

    storage.write_atomic = write_atomic


def slow_spill(seconds: float) -> None:
    """Each batch a SpillTokensFn spills waits ``seconds`` afterwards, its spill file open."""
    from transforms.core import spill

    original = spill.SpillTokensFn.process

    def process(self, batch):
        yield from original(self, batch)
        time.sleep(seconds)

    spill.SpillTokensFn.process = process


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--publish-delay", type=float, default=0.0)
    parser.add_argument("--marker-delay", type=float, default=0.0)
    parser.add_argument("--marker-note", default=None)
    parser.add_argument("--spill-delay", type=float, default=0.0)
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.publish_delay:
        slow_publish(args.publish_delay)
    if args.marker_delay or args.marker_note:
        slow_markers(args.marker_delay, args.marker_note)
    if args.spill_delay:
        slow_spill(args.spill_delay)
    from pipelines import cli

    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
