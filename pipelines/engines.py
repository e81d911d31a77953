"""Flink and Spark on this machine: the job servers `make engines` assembles, and the Beam flags
that ``--runner=FlinkRunner`` or ``--runner=SparkRunner`` alone stands for.

`make engines` puts each engine's job server in ``ENGINES_DIR`` (``~/.cache/beam-pretokenize``,
or the environment variable of that name): the runtime closure of Beam's runner at
RUNNER_VERSION in ``<engine>-<RUNNER_VERSION>/lib`` and a launcher jar beside it
(deploy/engine_launcher.py). Beam's Python runners start a job server with ``java -jar``; the
flags below hand them that jar, the engine's version and an embedded engine (Flink's MiniCluster,
Spark's ``local[2]``) with the SDK harness in this process (LOOPBACK). Each is added only where
the command line has none of its own: a flag the user gives wins. One line says what was chosen.

The JVM properties keep every port the job server's engine opens on 127.0.0.1 (Spark's driver
and block manager; its web UI is off), and open the JDK packages Spark needs on Java 17, as its
own launch scripts do. The job server's own gRPC ports are kept there by the launcher's main class
(deploy/engines/LoopbackJobServer.java).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from transforms.core.records import UsageError

log = logging.getLogger("pipelines")

RUNNER_VERSION = "2.70.0"  # beam.runner.version in deploy/flink/pom.xml and deploy/spark/pom.xml
FLINK_VERSION = "1.19"  # the one Flink line Beam's runner is served for (deploy/flink/pom.xml)
SPARK_MASTER = "local[2]"

# Spark's and Flink's own launch scripts open these JDK packages on Java 17; a job server started
# with `java -jar` runs without those scripts, so they are passed to its JVM here.
JAVA17_OPENS = (
    "-XX:+IgnoreUnrecognizedVMOptions",
    *(
        f"--add-opens=java.base/{package}=ALL-UNNAMED"
        for package in (
            "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
            "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs",
            "sun.security.action", "sun.util.calendar",
        )
    ),
)

# Where Spark's SparkContext listens (a SparkConf reads spark.* system properties): this machine only.
SPARK_LOOPBACK = (
    "-Dspark.driver.bindAddress=127.0.0.1",
    "-Dspark.driver.host=127.0.0.1",
    "-Dspark.ui.enabled=false",
)


def engines_dir() -> Path:
    return Path(os.environ.get("ENGINES_DIR") or Path.home() / ".cache" / "beam-pretokenize")


def job_server_jar(engine: str) -> Path:
    """The launcher jar of ``engine``'s (flink, spark) job server that `make engines` writes."""
    return engines_dir() / f"{engine}-{RUNNER_VERSION}" / "job-server.jar"


@dataclasses.dataclass(frozen=True)
class EmbeddedEngine:
    """A runner that runs on an engine started on this machine: its jar flag and default flags."""

    engine: str
    description: str
    jar_flag: str
    defaults: tuple[tuple[str, str], ...]
    jvm_properties: tuple[str, ...]


EMBEDDED = {
    "FlinkRunner": EmbeddedEngine(
        "flink", f"embedded Flink {FLINK_VERSION}", "flink_job_server_jar",
        (("flink_version", FLINK_VERSION), ("flink_master", "[local]"), ("environment_type", "LOOPBACK")),
        ()),
    "SparkRunner": EmbeddedEngine(
        "spark", f"Spark {SPARK_MASTER}", "spark_job_server_jar",
        (("spark_master_url", SPARK_MASTER), ("environment_type", "LOOPBACK")),
        (*JAVA17_OPENS, *SPARK_LOOPBACK)),
}


def engine_flags(runner: str | None, given: set[str]) -> list[str]:
    """The Beam flags a run with ``--runner=runner`` gets before those given (``given``: the names of
    the Beam flags on the command line): for FlinkRunner or SparkRunner, each default the command
    line has no flag for, and the JVM properties (before the user's, which so win); none for another
    runner. Says in one line what it chose. A UsageError when the job server is needed and `make
    engines` has not assembled it."""
    spec = EMBEDDED.get((runner or "").rsplit(".", 1)[-1])
    if spec is None:
        return []
    added = [f"--{name}={value}" for name, value in spec.defaults if name not in given]
    if spec.jar_flag not in given and "job_endpoint" not in given:
        jar = job_server_jar(spec.engine)
        if not jar.is_file():
            raise UsageError(
                f"--runner={runner}: no {spec.engine.capitalize()} job server at {jar}; run `make engines` in a "
                f"checkout of beam-pretokenize (ENGINES_DIR says where), or pass --{spec.jar_flag} or --job_endpoint")
        added.append(f"--{spec.jar_flag}={jar}")
    log.info("--runner=%s: %s; added %s (any flag you give wins)", runner, spec.description,
             " ".join(added) or "no flag")
    return added + [f"--job_server_jvm_property={p}" for p in spec.jvm_properties]
