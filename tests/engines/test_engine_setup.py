"""engine_setup against the Makefile it mirrors, and the skip message an engine that `make engines`
could not fetch gives: the one line of Maven's log that says why, quoted exactly."""

from __future__ import annotations

import re
from pathlib import Path

import engine_setup
import pytest
from conftest import REPO

from pipelines import engines

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
    """engine_setup and pipelines/engines.py compute the Makefile's paths, and the runner version
    they name is the one both poms resolve (ENGINES_DIR may be overridden in the environment, for all)."""
    if "ENGINES_DIR" not in engine_setup.os.environ:
        assert makefile_value("ENGINES_DIR").replace("$(HOME)", str(Path.home())) == str(
            engine_setup.ENGINES_DIR)
    assert makefile_value("FLINK_JAR") == "$(ENGINES_DIR)/flink-$(RUNNER_VERSION)/job-server.jar"
    assert makefile_value("SPARK_JAR") == "$(ENGINES_DIR)/spark-$(RUNNER_VERSION)/job-server.jar"
    for engine, jar in (("flink", engine_setup.FLINK_JAR), ("spark", engine_setup.SPARK_JAR)):
        pom = (REPO / "deploy" / engine / "pom.xml").read_text()
        (version,) = re.findall(r"<beam.runner.version>(.+?)</beam.runner.version>", pom)
        assert version == engines.RUNNER_VERSION, engine
        assert jar == engine_setup.ENGINES_DIR / f"{engine}-{version}" / "job-server.jar"
    flink_pom = (REPO / "deploy/flink/pom.xml").read_text()
    (flink_line,) = re.findall(r"<artifactId>beam-runners-flink-(.+?)</artifactId>", flink_pom)
    assert flink_line == engines.FLINK_VERSION


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
