"""Builds deploy/loopback_bind.c, the bind() shim that keeps Beam's gRPC servers on the loopback
address (the C file says why), and a ``java`` that runs with it preloaded.

`make engines` runs it to put both in ENGINES_DIR, for the job servers it assembles there
(pipelines/engines.py hands Beam the ``java`` as --job_server_java_launcher):

    python deploy/loopback_shim.py DIR

writes ``DIR/loopback_bind.so`` (``cc -shared -fPIC``) and ``DIR/java-loopback``, a shell script
that runs the ``java`` on PATH (as Beam does by default) with the shim in LD_PRELOAD. It prints one
line saying what it wrote or why it wrote nothing (no C compiler, say), and exits 0 either way:
without the shim the job servers still run, their Fn API ports on every interface. The local
clusters (deploy/localcluster.py) build the shim with ``build_library``. Each file is written
beside its final name and renamed into place, so one that exists is complete. Standard library
only: it runs before any virtualenv exists.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("loopback_bind.c")
LIBRARY = "loopback_bind.so"
LAUNCHER = "java-loopback"  # pipelines/engines.py names it too


class ShimError(Exception):
    """The shim could not be built; the message says why."""


def build_library(library: Path) -> Path:
    """Compile loopback_bind.c into ``library`` with the system's C compiler (``cc``). ShimError when
    there is none, when it fails, or when the path cannot go in LD_PRELOAD (a space or colon)."""
    library = Path(library).resolve()
    if any(c in str(library) for c in " \t\n:"):
        raise ShimError(f"{library}: LD_PRELOAD cannot name a path with a space or colon")
    if shutil.which("cc") is None:
        raise ShimError("no C compiler (cc) on PATH")
    partial = _partial(library)
    try:
        built = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl"],
                               capture_output=True, text=True)
        if built.returncode != 0:
            last = (built.stderr.strip().splitlines() or ["no message"])[-1]
            raise ShimError(f"cc could not build {SOURCE}: {last}")
        partial.chmod(0o755)
        os.replace(partial, library)
    finally:
        partial.unlink(missing_ok=True)
    return library


def write_launcher(launcher: Path, library: Path) -> Path:
    """Write ``launcher``: runs ``java`` (from PATH) with ``library`` first in LD_PRELOAD."""
    script = ("#!/bin/sh\n"
              f"# `java` with {SOURCE.name} preloaded: written by deploy/loopback_shim.py (make engines).\n"
              f"LD_PRELOAD={shlex.quote(str(library))}${{LD_PRELOAD:+\" $LD_PRELOAD\"}}\n"
              "export LD_PRELOAD\n"
              'exec java "$@"\n')
    partial = _partial(launcher)
    try:
        partial.write_text(script)
        partial.chmod(0o755)
        os.replace(partial, launcher)
    finally:
        partial.unlink(missing_ok=True)
    return launcher


def _partial(path: Path) -> Path:
    """A new empty file beside ``path`` (same directory, so that a rename replaces it atomically)."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(handle)
    return Path(name)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python deploy/loopback_shim.py DIR", file=sys.stderr)
        return 2
    directory = Path(argv[0]).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        library = build_library(directory / LIBRARY)
    except ShimError as error:
        print(f"loopback shim: NOT BUILT ({error}); the job servers' Fn API ports will listen on every interface")
        return 0
    print(f"loopback shim: {write_launcher(directory / LAUNCHER, library)} (java with {library} preloaded)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
