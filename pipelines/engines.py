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
(deploy/engines/HostBoundJobServer.java), and the Fn API servers Beam's runner opens while a job
runs by a bind() shim preloaded into the job server's JVM: `make engines` writes a ``java`` that
preloads it (deploy/loopback_shim.py), handed to Beam as --job_server_java_launcher with the jar.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from pathlib import Path

from pipelines.run_mode import runner_class
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


# Runners whose jobs run on a Java job server, which may hang up on a LOOPBACK harness (below).
JOB_SERVER_RUNNERS = ("FlinkRunner", "SparkRunner", "PortableRunner")


def engines_dir() -> Path:
    return Path(os.environ.get("ENGINES_DIR") or Path.home() / ".cache" / "beam-pretokenize")


def job_server_jar(engine: str) -> Path:
    """The launcher jar of ``engine``'s (flink, spark) job server that `make engines` writes."""
    return engines_dir() / f"{engine}-{RUNNER_VERSION}" / "job-server.jar"


def loopback_java() -> Path:
    """The ``java`` with the loopback bind() shim (loopback_bind.so beside it) preloaded that `make
    engines` writes (when it has a C compiler; deploy/loopback_shim.py)."""
    return engines_dir() / "java-loopback"


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
    engines` has not assembled it. On any Java job server the end-of-job hang-up is filtered
    (quiet_end_of_job_hangup, below)."""
    name = runner_class(runner or "")
    if name in JOB_SERVER_RUNNERS:
        quiet_end_of_job_hangup()
    spec = EMBEDDED.get(name)
    if spec is None:
        return []
    added = [f"--{flag}={value}" for flag, value in spec.defaults if flag not in given]
    if spec.jar_flag not in given and "job_endpoint" not in given:
        jar = job_server_jar(spec.engine)
        if not jar.is_file():
            raise UsageError(
                f"--runner={runner}: no {spec.engine.capitalize()} job server at {jar}; run `make engines` in a "
                f"checkout of beam-pretokenize (ENGINES_DIR says where), or pass --{spec.jar_flag} or --job_endpoint")
        added.append(f"--{spec.jar_flag}={jar}")
        added += _loopback_launcher(given)
    log.info("--runner=%s: %s%s; added %s (any flag you give wins)", runner, spec.description,
             _where_it_listens(added, given), " ".join(added) or "no flag")
    return added + [f"--job_server_jvm_property={p}" for p in spec.jvm_properties]


def _loopback_launcher(given: set[str]) -> list[str]:
    """The flag that has Beam start the assembled job server with loopback_java(), unless the command
    line names its own launcher or `make engines` could not write it."""
    launcher = loopback_java()
    written = launcher.is_file() and launcher.with_name("loopback_bind.so").is_file()
    if "job_server_java_launcher" in given or not written:
        return []
    return [f"--job_server_java_launcher={launcher}"]


def _where_it_listens(added: list[str], given: set[str]) -> str:
    """For the one line engine_flags prints: where the job server it supplies listens, if it does."""
    if any(flag.startswith("--job_server_java_launcher=") for flag in added):
        return ", every port bound to 127.0.0.1"
    if any("_job_server_jar=" in flag for flag in added) and "job_server_java_launcher" not in given:
        return f", its Fn API ports on every interface (no {loopback_java()}: `make engines` needs a C compiler)"
    return ""


# --- The end-of-job hang-up of a Java job server, filtered (SDK 2.77 against the 2.70 runners) ---
#
# When a job on a Java job server ends, the runner tears down the LOOPBACK SDK harness in this
# process by hanging up its data stream: gRPC status CANCELLED, details "Multiplexer hanging up".
# SDK 2.77's data channel (apache_beam/runners/worker/data_plane.py) marks itself closed only after
# joining its send thread, so the hang-up lands while it still counts as open: it logs "Failed to
# read inputs in the data plane." with a traceback, and the reader thread (read_grpc_client_inputs)
# and the worker thread (run_worker_N) end on the same error, each printed by threading.excepthook.
# The job has finished by then and its files are complete (the tests compare every byte). SDK 2.70
# marks the channel closed first and prints nothing. Only that error is dropped, only while a job
# runs on a Java job server: a job that fails is reported by the job service and raised by
# wait_until_finish, and any other error of those threads is printed as before.
HANGUP_DETAILS = "Multiplexer hanging up"


def is_end_of_job_hangup(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is the runner's hang-up above."""
    import grpc

    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, grpc.RpcError) and hasattr(error, "code") and hasattr(error, "details"):
            return error.code() == grpc.StatusCode.CANCELLED and HANGUP_DETAILS in (error.details() or "")
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class _HangupFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and is_end_of_job_hangup(record.exc_info[1]))


_HANGUP_FILTER = _HangupFilter()


def quiet_end_of_job_hangup() -> None:
    """Drop the hang-up's log record and thread tracebacks (above); any other goes on as before.
    The thread hook wraps the one in place when called (a test runner's, say)."""
    logging.getLogger("apache_beam.runners.worker.data_plane").addFilter(_HANGUP_FILTER)
    previous = threading.excepthook
    if getattr(previous, "quiets_hangup", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not is_end_of_job_hangup(args.exc_value):
            previous(args)

    hook.quiets_hangup = True
    threading.excepthook = hook
