"""engine_setup against the Makefile it mirrors, and the skip message an engine that `make engines`
could not fetch gives: the one line of Maven's log that says why, quoted exactly."""

from __future__ import annotations

import re

import engine_setup
import pytest
from conftest import REPO

# What Maven Central answers for a job-server jar it does not serve (the end of flink.log).
MAVEN_LOG = """\
[INFO] --- dependency:3.8.1:copy (default-cli) @ standalone-pom ---
[ERROR] Failed to execute goal org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy (default-cli) on \
project standalone-pom: Unable to find/resolve artifact. Could not find artifact \
org.apache.beam:beam-runners-flink-2.2-job-server:jar:2.77.0 in central (https://repo.maven.apache.org/maven2) -> \
[Help 1]
[ERROR]
[ERROR] To see the full stack trace of the errors, re-run Maven with the -e switch.
"""


def makefile_value(name: str) -> str:
    (value,) = re.findall(rf"^{name}\s*[?:]?=\s*(.+)$", (REPO / "Makefile").read_text(), flags=re.M)
    return value.strip()


def test_the_paths_match_the_makefile():
    """engine_setup computes the Makefile's paths (each may be overridden in the environment, for both)."""
    home = engine_setup.Path.home()
    for name, value in (("FLINK_VERSION", engine_setup.FLINK_VERSION), ("SPARK_VERSION", engine_setup.SPARK_VERSION),
                        ("JAR_CACHE", engine_setup.JAR_CACHE), ("ENGINES_DIR", engine_setup.ENGINES_DIR)):
        if name not in engine_setup.os.environ:
            assert makefile_value(name).replace("$(HOME)", str(home)) == str(value), name
    jar = "$(JAR_CACHE)/beam-runners-{}-$({}_VERSION)-job-server-$(BEAM_VERSION).jar"
    assert makefile_value("FLINK_JAR") == jar.format("flink", "FLINK")
    assert makefile_value("SPARK_JAR") == jar.format("spark", "SPARK")
    assert engine_setup.FLINK_JAR == engine_setup.JAR_CACHE / (
        f"beam-runners-flink-{engine_setup.FLINK_VERSION}-job-server-{engine_setup.BEAM_VERSION}.jar")
    assert engine_setup.SPARK_JAR == engine_setup.JAR_CACHE / (
        f"beam-runners-spark-{engine_setup.SPARK_VERSION}-job-server-{engine_setup.BEAM_VERSION}.jar")


@pytest.mark.parametrize(("log", "reason"), [
    (None, "`make engines` has not been run"),
    (MAVEN_LOG, "`make engines` could not fetch it: Could not find artifact "
                "org.apache.beam:beam-runners-flink-2.2-job-server:jar:2.77.0 in central"),
    ("go: downloading github.com/apache/beam/sdks/v2 v2.77.0\ngo: network is unreachable\n",
     "`make engines` failed: go: network is unreachable"),
])
def test_the_skip_reason_quotes_the_fetch_log(log, reason, tmp_path, monkeypatch):
    monkeypatch.setattr(engine_setup, "ENGINES_DIR", tmp_path)
    if log is not None:
        (tmp_path / "flink.log").write_text(log)
    assert engine_setup._fetch_failure("flink.log") == reason
