"""README.md and docs/ as a user reads them (issue 24): every command of the README's "One example per
job" section run as written, in order, in a directory laid out like the checkout; the Python blocks of
docs/reading-and-training.md's "Reading the output" on the tree they made; and every relative link of
README.md and docs/*.md leading to a file (and heading) that exists.

``.venv/bin/pretokenize`` lines go through the CLI in this interpreter (as tests/shards/test_reader_epochs.py
does), any other line through bash."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

from conftest import REPO, SAMPLE_PARQUET

CLI = "import sys; from pipelines.cli import main; sys.exit(main())"  # .venv/bin/pretokenize, in this interpreter
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    level = heading.split(" ")[0]
    end = text.find("\n" + level + " ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S)


def run_line(line: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = line.split("  #")[0].strip()
    if command.startswith(".venv/bin/pretokenize "):
        args = [sys.executable, "-c", CLI, *shlex.split(command)[1:]]
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_readme_starts_with_the_two_commands():
    first = blocks(README.read_text(encoding="utf-8"))[0]
    assert first[0] == "bash"
    assert [line.split("#")[0].strip() for line in first[1].splitlines()] == ["make demo", "make test"]


def test_the_readme_examples_run_as_written(tmp_path, monkeypatch):
    # The checkout's inputs the examples name, copied: the runs write out/ here, never into the checkout.
    for source in (SAMPLE_PARQUET, REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"):
        target = tmp_path / source.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    examples = section(README.read_text(encoding="utf-8"), "## One example per job")
    found = blocks(examples)
    assert [lang for lang, _ in found].count("bash") == 7 and [lang for lang, _ in found].count("python") == 1
    namespace: dict = {}
    ran = []
    for lang, code in found:
        if lang == "python":
            exec(compile(code, str(README), "exec"), namespace)
        elif lang == "bash":
            for line in code.replace("\\\n", " ").splitlines():
                done = run_line(line, tmp_path)
                assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
                ran.append(shlex.split(line)[:2])
    assert [".venv/bin/pretokenize", "remove"] in ran and [".venv/bin/pretokenize", "train-bpe"] in ran
    assert namespace["batch"].inputs.shape == (8, 1024)
    assert (tmp_path / "out" / "sample" / "megatron" / "data_args.txt").exists()
    removals = (tmp_path / "out" / "own-tokens" / "removals.txt").read_text(encoding="utf-8")
    assert "| <urn:uuid:8b989e0f-801c-588a-a475-a19cb7d3d10c> |" in removals
    # The document docs/architecture.md follows, where it says it ends: the first row of its shard.
    rows = (tmp_path / "out" / "sample" / "processed_spec.txt").read_text(encoding="utf-8").splitlines()
    first = next(row for row in rows if row.startswith("1024/p03_00000.npy | "))
    assert first == "1024/p03_00000.npy | <urn:uuid:8b989e0f-801c-588a-a475-a19cb7d3d10c> | 759"
    assert (tmp_path / "out" / "own-tokens" / "dataset_stats.txt").exists()
    assert (tmp_path / "out" / "scaffold-sample" / "dataset_stats.txt").exists()

    # docs/reading-and-training.md, "Reading the output", on the tree the examples made.
    reading = section((REPO / "docs" / "reading-and-training.md").read_text(encoding="utf-8"), "## Reading the output")
    code_blocks = [code for lang, code in blocks(reading) if lang == "python"]
    assert len(code_blocks) == 2
    namespace = {}
    for code in code_blocks:
        exec(compile(code, "docs/reading-and-training.md", "exec"), namespace)
    assert namespace["first_doc"][-1] == namespace["EOS"] and namespace["offsets"]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but '-', spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(m) for m in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_every_relative_link_of_the_docs_resolves():
    checked = 0
    for doc in [README, *DOCS]:
        text = re.sub(r"^```.*?^```$", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            assert path.is_file(), f"{doc.relative_to(REPO)}: link {target}: no such file"
            if anchor and path.suffix == ".md":
                assert anchor in headings(path), f"{doc.relative_to(REPO)}: link {target}: no such heading"
            checked += 1
    assert checked >= 20
