"""What the Flink and Spark cluster scripts share: processes started from a state directory, found
again by their recorded pid, and stopped by it alone; free ports on 127.0.0.1; the Python worker pool.

A cluster here is a handful of separate processes on this machine (deploy/flink/cluster.py,
deploy/spark/cluster.py), each started with its log and pid file in the cluster's state directory:

    state = State(Path("/tmp/my-flink"))
    state.start("jobmanager", ["java", ...], env)   # <state>/jobmanager.log, <state>/jobmanager.pid
    state.stop()                                    # only the recorded processes (and what they started)

A pid file holds the pid and the process's start time (/proc/<pid>/stat), so a pid the kernel has
since given to another process is never signalled. Everything listens on 127.0.0.1 only
(``listening_sockets`` lists what a process listens on, to check it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import loopback_shim  # deploy/loopback_shim.py, beside this file (the scripts put deploy/ on sys.path)

HOST = "127.0.0.1"
STOP_GRACE_SECONDS = 20
# Keep an SDK worker for the next stage of the job rather than start one per stage: each start
# imports Beam and the project in a new Python (seconds), and a job has a dozen stages per slot.
ENVIRONMENT_CACHE_MILLIS = 60_000


class ClusterError(RuntimeError):
    """A cluster that could not start, said in one line naming its log."""


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 right now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name start at field 3


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process ``pid`` started, and what they started, depth first."""
    found = []
    for child in _children(pid):
        found += [child, *descendants(child)]
    return found


class State:
    """A cluster's state directory: a log and a pid file per process, and ``cluster.json`` (its
    ports and the flags that submit a job to it)."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def _pid_file(self, name: str) -> Path:
        return self.root / f"{name}.pid"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start ``argv`` in its own session, its output to ``<name>.log``; record its pid."""
        if self.pid(name) is not None:
            raise ClusterError(f"{name} is already running (pid {self.pid(name)}, {self._pid_file(name)})")
        with open(self.log(name), "ab") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, cwd=self.root, start_new_session=True)
        self._pid_file(name).write_text(f"{process.pid} {_start_time(process.pid)}\n")
        return process.pid

    def pid(self, name: str) -> int | None:
        """The pid of the process started as ``name``, if that very process still runs."""
        try:
            pid, started = self._pid_file(name).read_text().split()
        except (OSError, ValueError):
            return None
        return int(pid) if _start_time(int(pid)) == started else None

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.pid"))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> list[int]:
        """Signal the process ``name`` and every process it started (a Spark worker's executors);
        returns the pids signalled."""
        pid = self.pid(name)
        if pid is None:
            return []
        family = [pid, *descendants(pid)]
        for member in family:
            try:
                os.kill(member, sig)
            except ProcessLookupError:
                pass
        return family

    def stop(self) -> list[str]:
        """Stop every recorded process (TERM, then KILL after STOP_GRACE_SECONDS) with what it
        started; returns the names that were running. Nothing unrecorded is signalled."""
        running = [name for name in self.names() if self.pid(name) is not None]
        family = {pid for name in running for pid in self.kill(name, signal.SIGTERM)}
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while time.monotonic() < deadline and any(_alive(pid) for pid in family):
            time.sleep(0.2)
        for pid in family:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for name in self.names():
            self._pid_file(name).unlink()
        return running

    def wait_for_port(self, name: str, port: int, timeout: float = 120) -> None:
        """Wait until something accepts on 127.0.0.1:``port``; fail naming ``name``'s log if the
        process died or the time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid(name) is None:
                raise ClusterError(f"{name} exited while starting: see {self.log(name)}")
            with socket.socket() as s:
                if s.connect_ex((HOST, port)) == 0:
                    return
            time.sleep(0.3)
        raise ClusterError(f"{name} did not listen on {HOST}:{port} within {timeout:.0f} s: see {self.log(name)}")

    def save(self, info: dict) -> None:
        (self.root / "cluster.json").write_text(json.dumps(info, indent=1) + "\n")

    def load(self) -> dict:
        path = self.root / "cluster.json"
        if not path.is_file():
            raise ClusterError(f"no cluster was started with state directory {self.root} (no {path})")
        return json.loads(path.read_text())


def _alive(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on (IPv4 and IPv6), from
    /proc/<pid>/net/tcp* matched against the inodes of the process's open sockets; [] for a
    process that has exited."""
    try:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        tables = [Path(f"/proc/{pid}/net/{table}").read_text() for table in ("tcp", "tcp6")]
    except (FileNotFoundError, ProcessLookupError):
        return []
    found = []
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1]))
    return found


def _address(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp's ``0100007F:1F90`` as ('127.0.0.1', 8080); IPv6 in its 32 hex digits."""
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host-endian
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def loopback_only(state: State, env: dict[str, str]) -> dict[str, str]:
    """``env`` with loopback_bind.c preloaded: for the processes that host Beam's gRPC servers,
    which otherwise listen on every interface (the C file says why). Built into the state
    directory with the system's C compiler (deploy/loopback_shim.py)."""
    library = state.root / loopback_shim.LIBRARY
    if not library.is_file():
        try:
            loopback_shim.build_library(library)
        except loopback_shim.ShimError as error:
            raise ClusterError(str(error)) from None
    preload = " ".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    return dict(env, LD_PRELOAD=preload)


def java_command(classpath: str, heap: str, main_class: str, *args: str, props: dict | None = None) -> list[str]:
    """``java`` with a capped heap, on ``classpath``, IPv4 preferred so that 127.0.0.1 is what binds."""
    return ["java", f"-Xmx{heap}", "-Djava.net.preferIPv4Stack=true",
            *(f"-D{key}={value}" for key, value in (props or {}).items()),
            "-cp", classpath, main_class, *args]


def start_worker_pool(state: State, port: int) -> None:
    """Beam's Python worker pool on 127.0.0.1:``port``, each SDK worker a process of this Python."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    state.start("worker-pool", [sys.executable, str(Path(__file__).resolve()), "worker-pool", str(port)], env)
    state.wait_for_port("worker-pool", port)


def serve_worker_pool(port: int) -> None:
    """Run Beam's worker pool service bound to 127.0.0.1 (Beam's own entry point,
    worker_pool_main, binds every interface); SDK workers it starts are processes (`python -c`
    from PATH, which start_worker_pool puts this Python first on)."""
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pool = BeamFnExternalWorkerPoolServicer(use_process=True)
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.add_insecure_port(f"{HOST}:{port}")
    server.start()
    print(f"worker pool listening on {HOST}:{port}", flush=True)

    def stop(*_):
        for worker in list(pool._worker_processes.values()):
            worker.kill()
        server.stop(0)

    signal.signal(signal.SIGTERM, stop)
    server.wait_for_termination()


def main(argv: list[str] | None = None, *, start, describe: str) -> int:
    """The command line every cluster script shares: start | stop | flags, with --state-dir;
    ``start(state, args)`` starts the cluster and returns its cluster.json."""
    parser = argparse.ArgumentParser(description=describe)
    parser.add_argument("command", choices=["start", "stop", "flags"])
    parser.add_argument("--state-dir", type=Path, required=True,
                        help="where the pids, logs, configuration and staged artifacts go (made if missing)")
    parser.add_argument("--lib", type=Path, default=None,
                        help="the engine's jars (default: `make engines`' lib/ folder under ENGINES_DIR)")
    args = parser.parse_args(argv)
    state = State(args.state_dir)
    try:
        if args.command == "start":
            state.root.mkdir(parents=True, exist_ok=True)
            running = [name for name in state.names() if state.pid(name) is not None]
            if running:  # refused before anything starts, so the failure path below stops nothing of theirs
                raise ClusterError(f"a cluster is already running from {state.root} ({', '.join(running)}): "
                                   "stop it first")
            try:
                state.save(start(state, args))
            except BaseException:
                state.stop()
                raise
        elif args.command == "stop":
            stopped = state.stop()
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
            return 0
        print(" ".join(state.load()["flags"]))
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["worker-pool"]:
    serve_worker_pool(int(sys.argv[2]))
