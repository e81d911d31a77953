"""The one module `make engines` substitutes links with the 2.70.0 runners around it.

Maven Central refuses beam-runners-java-job-service at the runners' own version, so the poms put
2.65.0 in its place (deploy/flink/pom.xml, deploy/spark/pom.xml). The JVM links lazily: a member
the runner uses and the substitute lacks would surface only as a NoSuchMethodError in the middle of
some job. So each closure is checked here, reading the class files (tests/engines/classfile.py):
every member of the substitute (org.apache.beam.runners.jobsubmission) that the runner's classes
use is declared there with the same descriptor, and every member of another Beam module the
substitute uses is found in the closure's 2.70.0 jars.
"""

from __future__ import annotations

import dataclasses

import classfile
import pytest
from engine_setup import ENGINES

from pipelines import engines

pytestmark = pytest.mark.engines

SUBSTITUTE = "beam-runners-java-job-service-2.65.0.jar"
JOB_SUBMISSION = "org/apache/beam/runners/jobsubmission/"
RUNNER_JARS = {"flink": f"beam-runners-flink-{engines.FLINK_VERSION}-{engines.RUNNER_VERSION}.jar",
               "spark": f"beam-runners-spark-3-{engines.RUNNER_VERSION}.jar"}


@pytest.fixture(scope="module", params=["flink", "spark"])
def closure(request):
    """An engine's runner classes, the substitute's classes, and its whole closure."""
    engine = next(e for e in ENGINES if e.name == request.param)
    engine.flags()  # skips (or fails, when required) if `make engines` has not set it up
    lib = engines.job_server_jar(request.param).parent / "lib"
    jars = sorted(lib.glob("*.jar"))
    assert lib / SUBSTITUTE in jars, f"{lib} has no {SUBSTITUTE}: the pom no longer substitutes it"
    assert not [j.name for j in jars if j.name.startswith("beam-runners-java-job-service-") and j.name != SUBSTITUTE]
    runner = classfile.classes_in(lib / RUNNER_JARS[request.param])
    return runner, classfile.classes_in(lib / SUBSTITUTE), classfile.Closure(jars)


def test_the_runner_finds_every_member_it_uses_in_the_substitute(closure):
    runner, _, jars = closure
    used = {r for c in runner for r in c.references if r.owner.startswith(JOB_SUBMISSION)}
    assert len(used) >= 5, f"the runner uses only {len(used)} jobsubmission members: is it the runner's jar?"
    assert classfile.unresolved(runner, jars, JOB_SUBMISSION) == []


def test_the_substitute_finds_every_beam_member_it_uses_at_2_70(closure):
    _, substitute, jars = closure
    used = {r for c in substitute for r in c.references if r.owner.startswith("org/apache/beam/")}
    assert len(used) >= 100
    assert classfile.unresolved(substitute, jars, "org/apache/beam/") == []


def test_the_check_names_a_member_the_substitute_lacks(closure, monkeypatch):
    """The check above would fail: with a constructor the runner calls taken out of the substitute's
    class, it names that constructor."""
    runner, _, jars = closure
    ref = sorted((r for c in runner for r in c.references if r.owner.startswith(JOB_SUBMISSION) and r.name == "<init>"),
                 key=str)[0]
    declared = jars.get(ref.owner)
    lacking = dataclasses.replace(declared, members=declared.members - {(ref.name, ref.descriptor)})
    real_get = jars.get
    monkeypatch.setattr(jars, "get", lambda name: lacking if name == ref.owner else real_get(name))
    assert classfile.unresolved(runner, jars, JOB_SUBMISSION) == [f"method {ref}"]
