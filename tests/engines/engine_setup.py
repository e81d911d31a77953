"""Where `make engines` puts each engine, the Beam flags that run a job on it, and what to say when
one is missing.

The paths match the Makefile's (BEAM_VERSION, ENGINES_DIR, and the launcher jars of the Flink and
Spark job servers it assembles: pipelines/engines.py): change them together. An engine that is not
set up skips its tests quoting the reason, unless it is named in PRETOKENIZE_REQUIRE_ENGINES (comma
or space separated; `.ci/run` sets it), which turns the skip into a failure, so CI cannot pass by
quietly skipping an engine it meant to test.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil

import apache_beam
import pytest
from conftest import tree_hashes  # noqa: F401 - the engine tests compare trees with it

from pipelines import engines

BEAM_VERSION = apache_beam.version.__version__
FLINK_VERSION = engines.FLINK_VERSION
ENGINES_DIR = engines.engines_dir()

PRISM_BIN = ENGINES_DIR / f"prism-v{BEAM_VERSION}" / "prism"
FLINK_JAR = engines.job_server_jar("flink")
SPARK_JAR = engines.job_server_jar("spark")

@dataclasses.dataclass(frozen=True)
class Engine:
    """One way of running a job: a name for test ids and the Beam flags, once the engine is there."""

    name: str
    description: str

    def flags(self) -> list[str]:
        """The Beam flags for this engine; skips (or fails, when required) if it is not set up."""
        problem = _missing(self.name)
        if problem:
            message = f"{self.description}: {problem}"
            if self.name in required_engines():
                pytest.fail(f"{message} (required by PRETOKENIZE_REQUIRE_ENGINES)")
            pytest.skip(message)
        return _FLAGS[self.name]()


ENGINES = [
    Engine("fnapi-1", "FnApiRunner, one in-process worker"),
    Engine("fnapi-2proc", "FnApiRunner, two worker processes"),
    Engine("prism", f"Prism v{BEAM_VERSION} (portable local runner)"),
    Engine("flink", f"FlinkRunner, embedded Flink {FLINK_VERSION} cluster, parallelism 2"),
    Engine("spark", "SparkRunner, Spark 3.5 local[2]"),
]

_FLAGS = {
    "fnapi-1": lambda: ["--runner=FnApiRunner", "--direct_num_workers=1"],
    "fnapi-2proc": lambda: [
        "--runner=FnApiRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "prism": lambda: ["--runner=PrismRunner", f"--prism_location={PRISM_BIN}", "--environment_type=LOOPBACK"],
    # Only what a user would type: pipelines/engines.py supplies the job server `make engines`
    # assembled, the Flink version, an embedded engine and a LOOPBACK harness.
    "flink": lambda: ["--runner=FlinkRunner", "--parallelism=2"],
    "spark": lambda: ["--runner=SparkRunner"],
}


def required_engines() -> set[str]:
    return set(re.split(r"[\s,]+", os.environ.get("PRETOKENIZE_REQUIRE_ENGINES", "").strip())) - {""}


def _fetch_failure(log_name: str) -> str:
    """The line of `make engines`' log that says why a fetch failed, if it left one."""
    log = ENGINES_DIR / log_name
    if not log.is_file():
        return "`make engines` has not been run"
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in lines:
        found = re.search(r"Could not find artifact .*? in \S+", line)
        if found:
            return f"`make engines` could not fetch it: {found.group(0)}"
    return f"`make engines` failed: {lines[-1] if lines else 'see ' + str(log)}"


def _missing(name: str) -> str | None:
    """Why engine ``name`` cannot run here, or None when it can."""
    if name == "prism" and not os.access(PRISM_BIN, os.X_OK):
        return f"no binary at {PRISM_BIN}; {_fetch_failure('prism.log')}"
    if name in ("flink", "spark"):
        if shutil.which("java") is None:
            return "no `java` on PATH (the job server is a Java program)"
        jar = FLINK_JAR if name == "flink" else SPARK_JAR
        if not jar.is_file():
            return f"no job-server jar at {jar}; {_fetch_failure(name + '.log')}"
    return None
