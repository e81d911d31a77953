"""Both jobs on clusters of separate processes, as a deployment runs them (deploy/flink/cluster.py:
a JobManager and two TaskManagers; deploy/spark/cluster.py: a master and two workers; each with
Beam's job server and Python worker pool), byte for byte against the in-process FnApiRunner; then
the same job with a TaskManager (a Spark worker) killed while it runs: the engine's own recovery
finishes it, or it stops and the same command finishes it, and either way the tree is the
FnApiRunner's, verifies, and was published once. Nothing any cluster process opens listens beyond
127.0.0.1.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from cluster_setup import (
    CLUSTERS,
    Cluster,
    PublishWatch,
    SocketWatch,
    cluster_flags_or_skip,
    job_command,
    run,
    spill_written,
)
from engine_setup import tree_hashes

from pipelines import verify

pytestmark = pytest.mark.cluster  # `make test-clusters`: too slow for `make test` (the Makefile says why)

ENGINES = list(CLUSTERS)
JOBS = ["bucketed", "scaffold"]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
# What each engine writes to its logs when it recovers from a lost TaskManager / worker.
RECOVERY = {
    "flink": ("jobmanager", "switched from state RUNNING to RESTARTING"),
    "spark": ("job-server", "Lost executor"),
}
# The processes in which Beam runs its Fn API servers for the SDK workers: the TaskManagers, the
# executors a Spark worker starts.
BEAM_HOST = {"flink": r"taskmanager-\d+$", "spark": r"worker-\d+ \(started by it"}
# The member each kill test takes down: a TaskManager, a Spark worker with its executor.
VICTIM = {"flink": "taskmanager-1", "spark": "worker-1"}
# How each engine comes through that kill, as `make test-clusters` found it (BENCHMARKS.md, "Engines:
# clusters"): "recovers" (the job finishes by itself: Flink restarts it on the slots left, Spark
# retries the lost executor's tasks on the other one) or "re-run" (the job stops, and the same
# command finishes it). Either leaves the same tree; the test holds each engine to the one it showed,
# so a change in how an engine recovers is seen rather than absorbed.
OUTCOME = {"flink": "recovers", "spark": "recovers"}
SAY = {"recovers": "finished through the engine's recovery", "re-run": "stopped, and the same command finished it"}


@pytest.fixture(scope="module", params=ENGINES, ids=lambda e: f"{e}-cluster")
def cluster(request, tmp_path_factory):
    cluster_flags_or_skip(request.param)
    started = Cluster(request.param, tmp_path_factory.mktemp(f"{request.param}-cluster-state"))
    try:
        started.start()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def references(tmp_path_factory, gpt2_spec):
    """Per job, the sha256 tree of its FnApiRunner output (the CLI, like the cluster runs)."""
    cache = {}

    def get(job: str) -> dict[str, str]:
        if job not in cache:
            out = tmp_path_factory.mktemp(f"reference-{job}") / "out"
            command = job_command(job, ["--runner=FnApiRunner"], out, gpt2_spec)
            finished = subprocess.run(command, capture_output=True, text=True)
            assert finished.returncode == 0, finished.stdout[-3000:]
            cache[job] = tree_hashes(out)
        return cache[job]

    return get


def assert_same_tree(out: Path, expected: dict[str, str], what: str) -> None:
    got = tree_hashes(out)
    assert sorted(got) == sorted(expected), f"{what}: a different set of files: {sorted(set(got) ^ set(expected))}"
    differing = [rel for rel in expected if got[rel] != expected[rel]]
    assert not differing, f"{what}: files differ from the FnApiRunner's: {differing}"


def verify_passes(out: Path, tmp_path: Path) -> None:
    verify.run(["--output", str(out), "--temp_location", str(tmp_path / "verify-tmp"), "--runner=FnApiRunner"])


# The listening sockets each cluster's processes opened during the jobs (SocketWatch), by engine.
SOCKETS: dict[str, dict[str, set]] = {}


@pytest.mark.parametrize("job", JOBS)
def test_cluster_job_writes_the_same_bytes_as_the_fnapi_runner(cluster, job, references, gpt2_spec, tmp_path):
    expected = references(job)
    out = tmp_path / "out"
    with PublishWatch(out) as watch, SocketWatch(cluster, SOCKETS.setdefault(cluster.engine, {})):
        finished = subprocess.run(job_command(job, cluster.flags, out, gpt2_spec), capture_output=True, text=True)
    assert finished.returncode == 0, f"{cluster.engine} cluster, {job}: {finished.stdout[-3000:]}"
    assert_same_tree(out, expected, f"{cluster.engine} cluster, {job}")
    watch.assert_published_once()


def test_cluster_listens_on_loopback_only(cluster, gpt2_spec, tmp_path):
    """Every socket every cluster process (and what it started: executors, SDK workers) listened
    on while the jobs ran is bound to 127.0.0.1. Run alone, it runs the bucketed job to watch."""
    seen = SOCKETS.setdefault(cluster.engine, {})
    with SocketWatch(cluster, seen) as watch:
        if not seen:  # no job was watched before this test
            finished = subprocess.run(job_command("bucketed", cluster.flags, tmp_path / "out", gpt2_spec),
                                      capture_output=True, text=True)
            assert finished.returncode == 0, finished.stdout[-3000:]
        watch.sample()
    assert {"job-server", "worker-pool"} <= set(seen), sorted(seen)
    # The processes that host Beam's Fn API servers were seen listening: the check read their sockets.
    beam_hosts = [role for role, sockets in seen.items() if re.match(BEAM_HOST[cluster.engine], role) and sockets]
    assert beam_hosts, f"no {BEAM_HOST[cluster.engine]} socket was seen while the jobs ran: {seen}"
    beyond = {role: sorted(s for s in sockets if s[0] not in LOOPBACK) for role, sockets in seen.items()}
    assert not any(beyond.values()), f"{cluster.engine} cluster processes listen beyond 127.0.0.1: {beyond}"


def test_cluster_finishes_a_job_through_a_killed_member(cluster, references, gpt2_spec, tmp_path):
    """Kill a TaskManager (a Spark worker and its executor) once the job runs and has spilled: the
    engine recovers, or the job stops and the same command finishes it; the tree is the
    FnApiRunner's, verifies, and was published once; and the way it came through is the one
    OUTCOME expects of this engine. Last in the module: the cluster is short of a member afterwards."""
    expected = references("bucketed")
    out = tmp_path / "out"
    command = job_command("bucketed", cluster.flags, out, gpt2_spec)
    victim = VICTIM[cluster.engine]
    with PublishWatch(out) as watch:
        job = run(command, tmp_path / "job.log")
        while job.poll() is None and not spill_written(out):
            time.sleep(0.05)
        assert job.poll() is None, f"the job ended before it spilled: {(tmp_path / 'job.log').read_text()[-3000:]}"
        killed = cluster.state.kill(victim)
        assert killed, f"{victim} was not running"
        finished_alone = job.wait(timeout=900) == 0
        outcome = "recovers" if finished_alone else "re-run"
        print(f"{cluster.engine}: {victim} killed (pids {killed}); the job {SAY[outcome]}")
        if not finished_alone:
            # It stopped: saying why without a traceback, and the same command finishes it.
            said = (tmp_path / "job.log").read_text(errors="replace")
            assert "Traceback" not in said, f"the job stopped with a traceback: {said[-3000:]}"
            again = subprocess.run(command, capture_output=True, text=True, timeout=900)
            assert again.returncode == 0, again.stdout[-3000:]
    log_name, recovered = RECOVERY[cluster.engine]
    assert recovered in cluster.state.log(log_name).read_text(errors="replace"), (
        f"{cluster.engine} shows no recovery ({recovered!r} in {log_name}.log): the kill came too late to test it")
    assert_same_tree(out, expected, f"{cluster.engine} cluster, {victim} killed")
    watch.assert_published_once()
    verify_passes(out, tmp_path)
    assert outcome == OUTCOME[cluster.engine], (
        f"{cluster.engine}: with {victim} killed the job {SAY[outcome]}; OUTCOME expects that it "
        f"{SAY[OUTCOME[cluster.engine]]} (the tree was right): {(tmp_path / 'job.log').read_text()[-2000:]}")


def test_cluster_publish_watch_catches_a_second_publish(tmp_path, gpt2_spec):
    """The check the tests above make of one publish fails on a tree published twice while
    watched (the same job run twice on it, on the FnApiRunner)."""
    out = tmp_path / "out"
    command = job_command("bucketed", ["--runner=FnApiRunner"], out, gpt2_spec)
    with PublishWatch(out) as watch:
        for _ in range(2):
            assert subprocess.run(command, capture_output=True).returncode == 0
    with pytest.raises(AssertionError, match="published 2 times"):
        watch.assert_published_once()
