"""deploy/loopback_shim.py: the bind() shim it builds turns a wildcard bind into a loopback bind in a
process it is preloaded into, and the ``java`` it writes runs the ``java`` on PATH with the shim
first in LD_PRELOAD (tests/engines/test_job_server_ports.py runs real jobs with it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from cluster_setup import DEPLOY, _load

pytestmark = pytest.mark.engines

shim = _load(DEPLOY / "loopback_shim.py", "loopback_shim_under_test")

BIND = "import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); print(s.getsockname()[0])"


@pytest.fixture
def library(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): the shim cannot be built here")
    return shim.build_library(tmp_path / shim.LIBRARY)


def test_a_wildcard_bind_becomes_a_loopback_bind(library):
    def bound(env):
        return subprocess.run([sys.executable, "-c", BIND], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert bound(dict(os.environ)) == "0.0.0.0"
    assert bound(dict(os.environ, LD_PRELOAD=str(library))) == "127.0.0.1"
    assert [p.name for p in library.parent.iterdir()] == [shim.LIBRARY]  # no partial file left


def test_the_java_it_writes_preloads_the_shim_before_any_other(library, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text('#!/bin/sh\necho "$LD_PRELOAD|$*"\n')
    (bin_dir / "java").chmod(0o755)
    launcher = shim.write_launcher(tmp_path / shim.LAUNCHER, library)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LD_PRELOAD="")
    assert subprocess.run([str(launcher), "-jar", "a b.jar"], env=env, capture_output=True, text=True,
                          check=True).stdout == f"{library}|-jar a b.jar\n"
    env["LD_PRELOAD"] = "/other.so"
    assert subprocess.run([str(launcher)], env=env, capture_output=True, text=True,
                          check=True).stdout == f"{library} /other.so|\n"


def test_a_path_ld_preload_would_split_is_refused(tmp_path):
    with pytest.raises(shim.ShimError, match="space or colon"):
        shim.build_library(tmp_path / "a b" / shim.LIBRARY)
