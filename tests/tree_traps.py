"""Helpers of the tests that point pretokenize's commands at trees with traps in them (symlinks to
an outside directory, names that climb out, user files where the tool writes): a directory's exact
state, to compare before and after, and a command's outcome through the CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat

from pipelines import cli


def snapshot(root) -> dict[str, str]:
    """Every entry under ``root`` by relative path: a file's sha256, a link's target, a directory's
    mark. Links are not followed, so a changed, added or deleted entry anywhere shows."""
    state = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                state[rel] = "link:" + os.readlink(path)
            elif os.path.isdir(path):
                state[rel] = "dir"
            elif not os.path.isfile(path):  # a FIFO, a socket, a device: marked, never opened
                state[rel] = f"special:{stat.S_IFMT(os.lstat(path).st_mode):o}"
            else:
                with open(path, "rb") as f:
                    state[rel] = hashlib.sha256(f.read()).hexdigest()
    return state


@dataclasses.dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def refusal(self) -> str:
        """The one line of a refusal: exit 2, no traceback, the message the last line of stderr
        (log lines of the launch may come before it)."""
        assert self.code == 2, f"exit {self.code}, expected a refusal (2); stderr: {self.err[-2000:]}"
        assert "Traceback" not in self.err, self.err
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert lines, "a refusal says why, on stderr"
        assert lines[-1].startswith("pretokenize "), lines[-1]
        return lines[-1]


def run_cli(capsys, argv: list[str]) -> Outcome:
    """``pretokenize ARGV`` as a user runs it (cli.main), with what it printed."""
    capsys.readouterr()
    code = cli.main(argv)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)
