"""A Flink 1.19 session cluster of separate processes on this machine, bound to 127.0.0.1: a
JobManager, two TaskManagers, Beam's Flink job server pointed at it, and Beam's Python worker pool.

    python deploy/flink/cluster.py start --state-dir /tmp/flink-cluster   # prints the flags to submit with
    python deploy/flink/cluster.py flags --state-dir /tmp/flink-cluster   # prints them again
    python deploy/flink/cluster.py stop  --state-dir /tmp/flink-cluster   # stops only what start started

Every process runs from the jars `make engines` assembled (ENGINES_DIR/flink-2.70.0/lib, or
--lib): Flink's entry points live in flink-runtime, so no Flink distribution is needed. Each
TaskManager has two slots and a small fixed memory budget; a job that loses a TaskManager restarts
(fixed delay, three attempts) on the slots left. See README.md beside this.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import localcluster  # noqa: E402 - deploy/localcluster.py, beside this folder
from localcluster import HOST, free_port, java_command  # noqa: E402

RUNNER_VERSION = "2.70.0"
TASK_MANAGERS = 2
SLOTS_PER_TASK_MANAGER = 2
JOB_MANAGER = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TASK_MANAGER = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
JOB_SERVER = "org.apache.beam.runners.flink.FlinkJobServerDriver"

# A TaskManager started without Flink's scripts must be given every memory component (the scripts
# compute them); the JVM's limits below are their sums.
TASK_MANAGER_MEMORY = {
    "taskmanager.memory.framework.heap.size": "128m",
    "taskmanager.memory.task.heap.size": "384m",
    "taskmanager.memory.framework.off-heap.size": "128m",
    "taskmanager.memory.task.off-heap.size": "0m",
    "taskmanager.memory.network.min": "128m",
    "taskmanager.memory.network.max": "128m",
    "taskmanager.memory.managed.size": "64m",
    "taskmanager.memory.jvm-metaspace.size": "256m",
    "taskmanager.memory.jvm-overhead.min": "128m",
    "taskmanager.memory.jvm-overhead.max": "128m",
}
TASK_MANAGER_JVM = ["-Xms512m", "-XX:MaxDirectMemorySize=256m", "-XX:MaxMetaspaceSize=256m"]


def default_lib() -> Path:
    engines = Path(os.environ.get("ENGINES_DIR", Path.home() / ".cache" / "beam-pretokenize"))
    return engines / f"flink-{RUNNER_VERSION}" / "lib"


def configuration(state_dir: Path, ports: dict[str, int]) -> dict[str, str]:
    """The cluster's flink-conf.yaml: every address and bind address 127.0.0.1."""
    return {
        "jobmanager.rpc.address": HOST,
        "jobmanager.rpc.port": str(ports["rpc"]),
        "jobmanager.bind-host": HOST,
        "rest.address": HOST,
        "rest.bind-address": HOST,
        "rest.port": str(ports["rest"]),
        "blob.server.port": str(ports["blob"]),
        "taskmanager.host": HOST,
        "taskmanager.bind-host": HOST,
        "taskmanager.rpc.port": "0",
        "taskmanager.data.port": "0",
        "metrics.internal.query-service.port": "0",
        "taskmanager.numberOfTaskSlots": str(SLOTS_PER_TASK_MANAGER),
        "taskmanager.cpu.cores": str(SLOTS_PER_TASK_MANAGER),
        **TASK_MANAGER_MEMORY,
        "jobmanager.memory.process.size": "768m",
        "cluster.evenly-spread-out-slots": "true",
        # Beam's job server ships its jars with each job; the TaskManagers already have them.
        "classloader.resolve-order": "parent-first",
        # A killed TaskManager is noticed when heartbeats to it fail (heartbeat.rpc-failure-threshold),
        # a hung one within heartbeat.timeout; the job then restarts.
        "heartbeat.interval": "2000",
        "heartbeat.timeout": "30000",
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "2 s",
        "io.tmp.dirs": str(state_dir / "tmp"),
        "blob.storage.directory": str(state_dir / "blobs"),
        "web.tmpdir": str(state_dir / "web"),
    }


def write_configuration(state_dir: Path, ports: dict[str, int]) -> Path:
    conf_dir = state_dir / "conf"
    conf_dir.mkdir(exist_ok=True)
    settings = configuration(state_dir, ports)
    for key in ("io.tmp.dirs", "blob.storage.directory", "web.tmpdir"):
        Path(settings[key]).mkdir(exist_ok=True)
    (conf_dir / "flink-conf.yaml").write_text("".join(f"{key}: {value}\n" for key, value in settings.items()))
    return conf_dir


def rest(port: int, path: str) -> dict:
    """GET the JobManager's REST API (``/overview``, ``/jobs/overview``...)."""
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=10) as response:
        return json.load(response)


def wait_for_slots(state: localcluster.State, rest_port: int, slots: int, timeout: float = 120) -> None:
    """Wait until the TaskManagers registered ``slots`` slots with the JobManager."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in state.names():
            if state.pid(name) is None:
                raise localcluster.ClusterError(f"{name} exited while starting: see {state.log(name)}")
        try:
            if rest(rest_port, "/overview").get("slots-total", 0) >= slots:
                return
        except OSError:  # 503 while the JobManager elects its leader
            pass
        time.sleep(0.5)
    raise localcluster.ClusterError(f"the TaskManagers did not register {slots} slots within {timeout:.0f} s: "
                                    f"see {state.log('taskmanager-1')}")


def start(state: localcluster.State, args) -> dict:
    """Start the JobManager, the TaskManagers, the worker pool and the job server, each waited for."""
    lib = (args.lib or default_lib()).resolve()
    if not any(lib.glob("flink-runtime-*.jar")):
        raise localcluster.ClusterError(f"no Flink jars in {lib}: run `make engines` first (or give --lib)")
    ports = {name: free_port() for name in ("rpc", "rest", "blob", "job", "artifact", "pool")}
    conf_dir = write_configuration(state.root, ports)
    classpath = f"{lib}/*"
    env = dict(os.environ, FLINK_CONF_DIR=str(conf_dir))
    beam_env = localcluster.loopback_only(state, env)  # the TaskManagers host Beam's Fn API servers
    state.start("jobmanager", java_command(classpath, "512m", JOB_MANAGER, "--configDir", str(conf_dir)), env)
    state.wait_for_port("jobmanager", ports["rest"])
    for n in range(1, TASK_MANAGERS + 1):
        command = java_command(classpath, "512m", TASK_MANAGER, "--configDir", str(conf_dir),
                               "-D", f"taskmanager.resource-id=taskmanager-{n}")
        state.start(f"taskmanager-{n}", [command[0], *TASK_MANAGER_JVM, *command[1:]], beam_env)
    wait_for_slots(state, ports["rest"], TASK_MANAGERS * SLOTS_PER_TASK_MANAGER)
    localcluster.start_worker_pool(state, ports["pool"])
    artifacts = state.root / "artifacts"
    state.start("job-server", java_command(
        classpath, "768m", JOB_SERVER, "--job-host", HOST, "--job-port", str(ports["job"]),
        "--artifact-port", str(ports["artifact"]), "--expansion-port", "-1",
        "--flink-master", f"{HOST}:{ports['rest']}", "--flink-conf-dir", str(conf_dir),
        "--artifacts-dir", str(artifacts)), beam_env)
    state.wait_for_port("job-server", ports["job"])
    flags = ["--runner=PortableRunner", f"--job_endpoint={HOST}:{ports['job']}",
             f"--parallelism={TASK_MANAGERS}",
             "--environment_type=EXTERNAL", f"--environment_config={HOST}:{ports['pool']}",
             f"--environment_cache_millis={localcluster.ENVIRONMENT_CACHE_MILLIS}"]
    return {"ports": ports, "rest": f"http://{HOST}:{ports['rest']}", "flags": flags}


if __name__ == "__main__":
    sys.exit(localcluster.main(start=start, describe=__doc__.split("\n\n")[0]))
