"""docs/training.md, run: every Python block in order in one namespace, and every bash block's
``.venv/bin/pretokenize`` lines through the CLI, in a directory holding out/sample (the bucketed job
on the bundled sample) and out/scaffold-sample (the scaffold job on the Portuguese sample), as
``make demo`` and ``make demo-scaffold`` write them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO, SAMPLE_PARQUET, import_trainer_module

from pipelines import bucketed, scaffold

DOC = REPO / "docs" / "training.md"
CLI = "import sys; from pipelines.cli import main; sys.exit(main())"  # .venv/bin/pretokenize, in this interpreter


def blocks():
    return re.findall(r"^```(\w+)\n(.*?)^```$", DOC.read_text(encoding="utf-8"), flags=re.M | re.S)


@pytest.fixture
def doc_dir(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("training_doc")
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(root / "out" / "sample"), "--runner=FnApiRunner"])
    scaffold.run(["--input", str(REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"), "--output",
                  str(root / "out" / "scaffold-sample"), "--tokenizer", "gpt2", "--shard-tokens", "4000",
                  "--runner=FnApiRunner"])
    monkeypatch.chdir(root)
    return root


def test_the_training_doc_runs(doc_dir):
    for module, reason in [("torch", "the torch extra"), ("torchdata", "the torch extra"),
                           ("accelerate", "the trainers extra (make venv-trainers)"),
                           ("megatron.core", "the trainers extra (make venv-trainers)"),
                           ("olmo_core", "the trainers extra (make venv-trainers)")]:
        import_trainer_module(module, f"{module} comes with {reason}; CI installs it")
    found = blocks()
    assert [lang for lang, _ in found] == ["python", "python", "bash", "text", "python", "python", "text", "python"]
    namespace: dict = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for lang, code in found:
        if lang == "python":
            exec(compile(code, str(DOC), "exec"), namespace)
        elif lang == "bash":
            for line in code.splitlines():
                args = shlex.split(line.split("  #")[0])
                assert args[0] == ".venv/bin/pretokenize"
                subprocess.run([sys.executable, "-c", CLI, *args[1:]], check=True, cwd=doc_dir, env=env)
    assert namespace["result"].global_step == 2 and len(namespace["dataset"]) > 0


def test_the_readme_links_the_training_doc():
    assert "(docs/training.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "(training.md)" in (REPO / "docs" / "reading-and-training.md").read_text(encoding="utf-8")
