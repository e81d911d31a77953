"""Helpers of the tests that point pretokenize's commands at trees with traps in them (symlinks to
an outside directory, names that climb out, user files where the tool writes): a directory's exact
state, to compare before and after (a command's outcome: conftest.run_cli)."""

from __future__ import annotations

import hashlib
import os
import stat


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
