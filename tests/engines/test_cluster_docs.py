"""The Flink and Spark commands in deploy/ parse as written: each `pretokenize` command there goes
through its job's own parser and Beam's (a misspelt flag is an error, not a warning), both jobs are
given in full for each runner, and every submission stages its artifacts on shared storage
(--artifacts_dir, apache/beam#32743). The clusters themselves are not here to run them on."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import REPO

from pipelines import bucketed, scaffold, verify

DOCS = {"flink": REPO / "deploy" / "flink" / "README.md", "spark": REPO / "deploy" / "spark" / "README.md"}
PARSERS = {"bucketed": bucketed.parse_args, "scaffold": scaffold.parse_args, "verify": verify.parse_args}


def commands(doc) -> list[list[str]]:
    """Every command of the doc's bash blocks, continuation lines joined, split as bash would."""
    blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def jobs(doc) -> list[list[str]]:
    return [c for c in commands(doc) if c and c[0] == "pretokenize"]


@pytest.mark.parametrize("runner", list(DOCS))
def test_both_jobs_are_given_in_full_with_shared_artifacts(runner):
    found = jobs(DOCS[runner])
    assert {c[1] for c in found} >= {"bucketed", "scaffold", "verify"}
    for command in found:
        assert "..." not in command, f"not given in full: {shlex.join(command)}"
        flags = dict(arg.split("=", 1) for arg in command if arg.startswith("--") and "=" in arg)
        if flags.get("--runner") in ("FlinkRunner", "SparkRunner"):
            # The runner starts the job server here: it must stage where the cluster reads.
            assert re.match(r"(gs|s3)://\S+", flags.get("--artifacts_dir", "")), shlex.join(command)
        else:
            assert flags.get("--runner") == "PortableRunner" and "--job_endpoint" in flags
    if runner == "spark":
        (server,) = [c for c in commands(DOCS[runner]) if c[0] == "java"]
        assert any(re.match(r"--artifacts-dir=(gs|s3)://", arg) for arg in server), shlex.join(server)


@pytest.mark.parametrize("command", [c for doc in DOCS.values() for c in jobs(doc)], ids=lambda c: c[1])
def test_each_command_parses(command):
    PARSERS[command[1]](command[2:])  # a UsageError names any flag neither the job nor Beam knows
