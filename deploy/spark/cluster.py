"""A Spark 3.5 standalone cluster of separate processes on this machine, bound to 127.0.0.1: a
master, two workers (each launching its own executor JVM), Beam's Spark job server (which hosts
the driver) pointed at it, and Beam's Python worker pool.

    python deploy/spark/cluster.py start --state-dir /tmp/spark-cluster   # prints the flags to submit with
    python deploy/spark/cluster.py flags --state-dir /tmp/spark-cluster   # prints them again
    python deploy/spark/cluster.py stop  --state-dir /tmp/spark-cluster   # stops only what start started

Every process runs from the jars `make engines` assembled (ENGINES_DIR/spark-2.70.0/lib, or
--lib). A worker launches executors through Spark's launcher library, which wants a Spark home
holding a `jars/` folder and a `RELEASE` file: the state directory gets one whose `jars` is a link
to that lib/, so the executors run the very jars the driver does (Spark 3.5.0, as Beam's runner was
built against). See README.md beside this.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import localcluster  # noqa: E402 - deploy/localcluster.py, beside this folder
from localcluster import HOST, free_port, java_command  # noqa: E402

RUNNER_VERSION = "2.70.0"
WORKERS = 2
CORES_PER_WORKER = 1
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
JOB_SERVER = "org.apache.beam.runners.spark.SparkJobServerDriver"

# What Spark's own launch scripts open for Java 17 (its JavaModuleOptions), given to every JVM here.
JAVA17_OPENS = [
    "-XX:+IgnoreUnrecognizedVMOptions",
    *(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
        "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio", "java.util",
        "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs", "sun.security.action",
        "sun.util.calendar")),
]


def default_lib() -> Path:
    engines = Path(os.environ.get("ENGINES_DIR", Path.home() / ".cache" / "beam-pretokenize"))
    return engines / f"spark-{RUNNER_VERSION}" / "lib"


def spark_home(state_dir: Path, lib: Path) -> Path:
    """A Spark home for the workers' launcher: `RELEASE`, and `jars` linking to the engine's lib/."""
    home = state_dir / "spark-home"
    home.mkdir(exist_ok=True)
    (home / "RELEASE").write_text(f"Spark 3.5.0 jars from {lib} (deploy/spark/cluster.py)\n")
    jars = home / "jars"
    if jars.is_symlink():
        jars.unlink()
    elif jars.exists():
        raise localcluster.ClusterError(f"{jars} exists and is not the link this script makes: move it away")
    jars.symlink_to(lib, target_is_directory=True)
    return home


def environment(state_dir: Path, home: Path) -> dict[str, str]:
    """What every Spark process here gets: its home, and 127.0.0.1 as the address it binds."""
    local = state_dir / "local"
    local.mkdir(exist_ok=True)
    return dict(os.environ, SPARK_HOME=str(home), SPARK_SCALA_VERSION="2.12", SPARK_LOCAL_IP=HOST,
                SPARK_LOCAL_DIRS=str(local), SPARK_CONF_DIR=str(state_dir / "conf"))


def spark(classpath: str, heap: str, main_class: str, *args: str, props: dict | None = None) -> list[str]:
    command = java_command(classpath, heap, main_class, *args, props=props)
    return [command[0], *JAVA17_OPENS, *command[1:]]


def driver_properties(state_dir: Path) -> dict[str, str]:
    """The Spark settings of the driver, which runs inside the job server (read from `-D`s)."""
    executor_options = " ".join(["-Djava.net.preferIPv4Stack=true", *JAVA17_OPENS])
    return {
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.ui.enabled": "false",
        "spark.executor.memory": "640m",
        "spark.executor.extraJavaOptions": executor_options,
        "spark.task.maxFailures": "4",
    }


def start(state: localcluster.State, args) -> dict:
    """Start the master, the workers, the worker pool and the job server, each waited for."""
    lib = (args.lib or default_lib()).resolve()
    if not any(lib.glob("spark-core_2.12-*.jar")):
        raise localcluster.ClusterError(f"no Spark jars in {lib}: run `make engines` first (or give --lib)")
    ports = {name: free_port() for name in ("master", "master-ui", "job", "artifact", "pool")}
    env = environment(state.root, spark_home(state.root, lib))
    beam_env = localcluster.loopback_only(state, env)  # executors and the driver host Beam's servers
    classpath = f"{lib}/*"
    master_url = f"spark://{HOST}:{ports['master']}"
    state.start("master", spark(classpath, "256m", MASTER, "--host", HOST, "--port", str(ports["master"]),
                                "--webui-port", str(ports["master-ui"]), props={"spark.worker.timeout": "30"}), env)
    state.wait_for_port("master", ports["master"])
    for n in range(1, WORKERS + 1):
        work_dir = state.root / f"worker-{n}-work"
        work_dir.mkdir(exist_ok=True)
        ports[f"worker-{n}"], ports[f"worker-{n}-ui"] = free_port(), free_port()
        state.start(f"worker-{n}", spark(
            classpath, "256m", WORKER, master_url, "--host", HOST, "--port", str(ports[f"worker-{n}"]),
            "--webui-port", str(ports[f"worker-{n}-ui"]), "--cores", str(CORES_PER_WORKER), "--memory", "1g",
            "--work-dir", str(work_dir)), beam_env)
    for n in range(1, WORKERS + 1):
        state.wait_for_port(f"worker-{n}", ports[f"worker-{n}"])
    localcluster.start_worker_pool(state, ports["pool"])
    state.start("job-server", spark(
        classpath, "768m", JOB_SERVER, "--job-host", HOST, "--job-port", str(ports["job"]),
        "--artifact-port", str(ports["artifact"]), "--expansion-port", "-1", "--spark-master-url", master_url,
        "--artifacts-dir", str(state.root / "artifacts"), props=driver_properties(state.root)), beam_env)
    state.wait_for_port("job-server", ports["job"])
    flags = ["--runner=PortableRunner", f"--job_endpoint={HOST}:{ports['job']}",
             "--environment_type=EXTERNAL", f"--environment_config={HOST}:{ports['pool']}",
             f"--environment_cache_millis={localcluster.ENVIRONMENT_CACHE_MILLIS}"]
    return {"ports": ports, "master": master_url, "master_ui": f"http://{HOST}:{ports['master-ui']}",
            "flags": flags}


if __name__ == "__main__":
    sys.exit(localcluster.main(start=start, describe=__doc__.split("\n\n")[0]))
