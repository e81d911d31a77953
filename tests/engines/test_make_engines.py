"""`make engines` rebuilds what it built from the checkout when that content changes, and only then.

A fresh clone's files are all newer than the cache `make engines` filled from another checkout (or
an hour ago): a Makefile that compares mtimes re-copies the whole Maven closure, recompiles the
launcher and rebuilds the loopback shim on every run there. The Makefile's engine targets run here
on a copy of the files they read, against a cache of their own, with `mvn`, `javac` and `cc`
replaced on PATH by scripts that write a token output and log each call: the test counts the calls.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from pipelines import engines as engine_paths

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no `make` on PATH")

# What the engine targets read from the checkout (the Makefile's STAMPED lists, the versions' sources).
INPUTS = ["Makefile", "pyproject.toml", "deploy/flink/pom.xml", "deploy/spark/pom.xml",
          "deploy/flink/embedded-flink-conf.yaml", "deploy/engine_launcher.py",
          "deploy/engines/HostBoundJobServer.java", "deploy/loopback_bind.c", "deploy/loopback_shim.py"]
TARGETS = ["flink-job-server", "spark-job-server", "loopback-shim"]

# Each stand-in logs "<tool> <what it was asked to build>" and writes a token of that output.
STAND_INS = {
    "mvn": '[ -z "$MVN_FAILS" ] || exit 1\n'
           'for a; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; '
           '*pom.xml) pom="$a";; esac; done\n'
           'mkdir -p "$out" && : > "$out/fake.jar" && echo "mvn $pom" >> "$CALLS"\n',
    "javac": 'while [ $# -gt 0 ]; do [ "$1" = -d ] && out="$2"; shift; done\n'
             'mkdir -p "$out/x" && : > "$out/x/A.class" && echo "javac $out" >> "$CALLS"\n',
    "cc": 'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
          ': > "$out" && echo "cc" >> "$CALLS"\n',
}


@pytest.fixture
def checkout(tmp_path):
    """A copy of the files the engine targets read, and a PATH whose mvn, javac and cc log their calls."""
    root = tmp_path / "checkout"
    for rel in INPUTS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in STAND_INS.items():
        (bin_dir / tool).write_text("#!/bin/sh\n" + body)
        (bin_dir / tool).chmod(0o755)
    return root


def run_make(root: Path, **env: str) -> subprocess.CompletedProcess:
    """The engine targets in ``root``, against their own cache, the stand-ins first on PATH."""
    env = dict(os.environ, CALLS=str(root.parent / "calls.log"), PATH=f"{root.parent / 'bin'}:{os.environ['PATH']}",
               **env)
    finished = subprocess.run(["make", "-s", *TARGETS, f"ENGINES_DIR={root.parent / 'engines'}",
                               f"PYTHON={sys.executable}"], cwd=root, env=env, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return finished


def make_engines(root: Path) -> list[str]:
    """Run the engine targets in ``root``; the calls the stand-ins logged during this run."""
    calls = root.parent / "calls.log"
    calls.unlink(missing_ok=True)
    finished = run_make(root)
    assert "NOT SET UP" not in finished.stdout, finished.stdout
    return sorted(calls.read_text().split("\n")[:-1]) if calls.exists() else []


def age(tree: Path, seconds: float) -> None:
    """Set the mtime of everything under ``tree`` (and itself) ``seconds`` in the past."""
    then = time.time() - seconds
    for path in [tree, *tree.rglob("*")]:
        os.utime(path, (then, then), follow_symlinks=False)


def edit(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line)


def test_a_fresh_checkout_rebuilds_nothing_and_a_changed_input_rebuilds_its_step(checkout):
    engines = checkout.parent / "engines"
    first = make_engines(checkout)
    assert [call.split()[0] for call in first] == ["cc", "javac", "javac", "mvn", "mvn"], first
    assert (engines / f"flink-{engine_paths.RUNNER_VERSION}" / "job-server.jar").is_file()
    # The cache from an hour ago, the checkout just cloned: every checkout file is newer.
    age(engines, 3600)
    assert make_engines(checkout) == [], "a checkout newer than the cache rebuilt unchanged steps"
    edit(checkout / "deploy/flink/pom.xml", "<!-- another dependency -->\n")
    again = make_engines(checkout)
    assert again == ["javac " + str(engines / f"flink-{engine_paths.RUNNER_VERSION}" / "classes"),
                     "mvn deploy/flink/pom.xml"], again
    edit(checkout / "deploy/engines/HostBoundJobServer.java", "// changed\n")
    assert [call.split()[0] for call in make_engines(checkout)] == ["javac", "javac"]
    edit(checkout / "deploy/loopback_bind.c", "/* changed */\n")
    assert make_engines(checkout) == ["cc"]


def test_a_failed_copy_leaves_no_launcher_naming_the_jars_it_removed(checkout):
    """The closure is removed before a new copy; when the copy fails, the launcher goes too, so the
    engine's tests skip quoting the log rather than start a job server with no classes."""
    jar = checkout.parent / "engines" / f"spark-{engine_paths.RUNNER_VERSION}" / "job-server.jar"
    make_engines(checkout)
    assert jar.is_file()
    edit(checkout / "deploy/spark/pom.xml", "<!-- a dependency Maven cannot resolve -->\n")
    failed = run_make(checkout, MVN_FAILS="1")
    assert "spark: NOT SET UP" in failed.stdout, failed.stdout
    assert not jar.exists() and not jar.with_name("lib").exists()
    assert make_engines(checkout) == ["javac " + str(jar.with_name("classes")), "mvn deploy/spark/pom.xml"]
