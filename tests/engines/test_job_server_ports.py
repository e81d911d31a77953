"""The job servers `make engines` assembles listen on 127.0.0.1 only.

Beam's JobServerDriver makes its job and artifact services listen on every interface whatever
--job-host says (its ServerFactory binds NettyServerBuilder.forPort). The launcher's main class
(deploy/engines/HostBoundJobServer.java) binds them to the --job-host address. Each server is
started here as Beam's FlinkRunner / SparkRunner starts it (`java -jar LAUNCHER` with dynamic
ports), and every socket its JVM listens on is read from /proc/net/tcp and /proc/net/tcp6.

While a job runs, Beam's runner in that JVM opens the Fn API servers (control, data, state,
logging) with a ServerFactory nothing configures, which binds every interface; the ``java`` that
`make engines` writes (deploy/loopback_shim.py) preloads a bind() shim that keeps them on the
loopback address. The last test runs a job as a user would and watches every port it opens.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time
from pathlib import Path

import pytest
from cluster_setup import job_command, localcluster, run
from engine_setup import ENGINES

from pipelines import engines

pytestmark = pytest.mark.engines

LISTEN = "0A"
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
ARGS = {"flink": ["--flink-master", "[local]"], "spark": ["--spark-master-url", "local[2]"]}
DRIVERS = {"flink": "org.apache.beam.runners.flink.FlinkJobServerDriver",
           "spark": "org.apache.beam.runners.spark.SparkJobServerDriver"}


def listening(pid: int) -> list[tuple[str, int]]:
    """(address in /proc's hex, port) of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == LISTEN and fields[9] in inodes:
                found.append((address, int(port, 16)))
    return found


def job_server_ports(command: list[str], tmp_path: Path, expected: int = 3) -> list[tuple[str, int]]:
    """Start a job server, wait (up to 10 minutes, on a busy machine) until its JVM listens on
    ``expected`` ports (job, artifact and expansion services), and return them; then stop it."""
    log = tmp_path / "job-server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, f"the job server exited: {log.read_text(errors='replace')[-2000:]}"
            if len(listening(server.pid)) >= expected:
                time.sleep(2)  # any port opened right after the last service's
                return listening(server.pid)
            time.sleep(1)
        raise AssertionError(f"the job server did not start: {log.read_text(errors='replace')[-2000:]}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(params=["flink", "spark"])
def engine(request) -> str:
    next(e for e in ENGINES if e.name == request.param).flags()  # skips (or fails) when not set up
    return request.param


def launch(engine: str, tmp_path: Path, *java: str) -> list[str]:
    properties = engines.EMBEDDED[f"{engine.capitalize()}Runner"].jvm_properties
    return ["java", *properties, *java, *ARGS[engine], "--job-port", "0", "--artifact-port", "0",
            "--expansion-port", "0", "--artifacts-dir", str(tmp_path / "artifacts")]


def test_every_port_of_the_job_server_is_on_127_0_0_1(engine, tmp_path):
    ports = job_server_ports(launch(engine, tmp_path, "-jar", str(engines.job_server_jar(engine))), tmp_path)
    assert len(ports) == 3, ports
    assert [p for p in ports if p[0] not in LOOPBACK] == []


def test_the_driver_alone_listens_on_every_interface(tmp_path):
    """Why the launcher's main class exists: Beam's own driver, same flags, binds the wildcard."""
    next(e for e in ENGINES if e.name == "flink").flags()
    command = launch("flink", tmp_path, "-cp", str(engines.job_server_jar("flink")), DRIVERS["flink"])
    ports = job_server_ports(command, tmp_path)
    assert [p for p in ports if p[0] not in LOOPBACK], ports


def job_server_family(pid: int) -> list[int]:
    """The job server's JVM among the processes ``pid`` started, and what that JVM started."""
    for child in localcluster.descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"job-server.jar") for arg in command):
            return [child, *localcluster.descendants(child)]
    return []


def connected_ports(pid: int) -> set[int]:
    """The remote ports of the TCP connections process ``pid`` has open to this machine."""
    inodes = {os.readlink(fd)[len("socket:["):-1] for fd in Path(f"/proc/{pid}/fd").iterdir()
              if os.readlink(fd).startswith("socket:[")}
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
                ports.add(int(fields[2].split(":")[1], 16))
    return ports


def watch_job(job: subprocess.Popen) -> tuple[set, set]:
    """Until ``job`` ends, every 0.2 s: the (address, port) pairs the job server's JVM and its
    children listen on, and the ports the job's process (the LOOPBACK harness is in it) connects to."""
    listened, connected = set(), set()
    while job.poll() is None:
        try:
            for pid in job_server_family(job.pid):
                listened.update(localcluster.listening_sockets(pid))
            connected.update(connected_ports(job.pid))
        except OSError:
            pass  # a process or socket that went away between two reads
        time.sleep(0.2)
    return listened, connected


def test_a_job_on_the_assembled_job_server_listens_on_127_0_0_1_only(engine, tmp_path):
    """`--runner=FlinkRunner` / `--runner=SparkRunner` alone, the bundled sample bucketed: every port
    the job server's JVM opens while the job runs, the Fn API servers included, is on 127.0.0.1."""
    log = tmp_path / "job.log"
    runner = f"--runner={engine.capitalize()}Runner"
    job = run(job_command("bucketed", [runner], tmp_path / "out", gpt2=""), log)
    try:
        listened, connected = watch_job(job)
    finally:
        job.kill()
    assert job.wait() == 0, log.read_text(errors="replace")[-3000:]
    fn_api = {port for _, port in listened} & connected
    assert len(listened) > 3 and len(fn_api) >= 3, (listened, connected)  # idle, it has 3 (above)
    assert [p for p in listened if not is_loopback(p[0])] == []
    assert "every port bound to 127.0.0.1" in log.read_text()


def is_loopback(address: str) -> bool:
    """127.0.0.1, or the IPv6 address of the loopback (::1, ::ffff:127.0.0.1)."""
    parsed = ipaddress.ip_address(address)
    return parsed.is_loopback or bool(getattr(parsed, "ipv4_mapped", None) and parsed.ipv4_mapped.is_loopback)
