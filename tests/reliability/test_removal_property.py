"""The removal property (issue 23): random sequences of commands over one tree, some killed with
SIGKILL at a random point, never lose an accepted removal request.

Commands: bucketed (changing --partitions, --max-shard-bytes, --id-field, a --removal-list), remove of
random ids, export megatron, stats, and train-bpe with the tree as its --removal-list, each in a fresh
process as a user runs it; a kill is os._exit(9) after a random number of file moves (every publish,
rewrite and commit of the tool is a move). A killed command is followed by the same command again
(resume) or by another. An id is accepted once a command that takes it exits 0, or once its journal
is on disk (a kill after that must not lose it). After every command that exits 0 while the tree is finished:

    - no file under the tree (shards, manifest, exports, description, temporary files) holds an
      accepted id, but removals.txt, which lists them;
    - removals.txt holds every line it ever held;
    - a train-bpe run with the tree as its list left out every document its log names: no such
      document's secret word (a word of its own, repeated enough to be learnt: secret()) is a token of
      the learnt vocabulary (tokenizer.tiktoken) nor appears in tokenizer.json or merges.txt, while
      some other document's is (so the check can fail), and its stats count them as removed.

REMOVAL_PROPERTY_SEQUENCES (default 2) sets how many sequences run; REMOVAL_PROPERTY_SEED the first seed.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, finepdfs_row

RUNNER = "--runner=FnApiRunner"


def secret(i: int) -> str:
    """A word only document i holds (letters only, so one pre-token): "Zqaavex", "Zqabvex", ..."""
    high, low = divmod(i, 26)
    return f"Zq{chr(97 + high)}{chr(97 + low)}vex"


# Each document repeats its secret word 12 times: 400 merges learn every one of them (checked).
ROWS = [{**finepdfs_row(f"doc-{i:03d}", f"Document {i} says something about topic {i % 7}. " * (2 + i % 11)
                        + " ".join([secret(i)] * 12)), "doc_key": f"key-{i:03d}"} for i in range(90)]
SEQUENCES = int(os.environ.get("REMOVAL_PROPERTY_SEQUENCES", "2"))
FIRST_SEED = int(os.environ.get("REMOVAL_PROPERTY_SEED", "2323"))
STEPS = 6

KILLER = """
import os, sys
from fsspec.implementations.local import LocalFileSystem
left = [int(sys.argv[1])]
real_mv = LocalFileSystem.mv
def mv(self, *a, **k):
    result = real_mv(self, *a, **k)
    left[0] -= 1
    if left[0] == 0:
        os._exit(9)
    return result
LocalFileSystem.mv = mv
from pipelines import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def run(args: list[str], kill_after: int) -> int:
    proc = subprocess.run([sys.executable, "-c", KILLER, str(kill_after), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in proc.stderr or proc.returncode == 9, proc.stderr[-3000:]
    return proc.returncode


def log_lines(out) -> list[str]:
    path = out / "removals.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def journal_ids(out) -> set[str]:
    files = out / ".pretokenize-tmp" / "removal" / "files"
    if not (out / ".pretokenize-tmp" / "removal" / "plan.json").exists() or not files.exists():
        return set()
    ids = set()
    for name in os.listdir(files):
        ids.update(i for i, _, removed in json.loads((files / name).read_text())["rows"] if removed)
    return ids


def log_field(out) -> str:
    """The input field removals.txt's ids are values of ("id" when it has none yet)."""
    lines = log_lines(out)
    return json.loads(lines[1].split(":", 1)[1]) if len(lines) > 1 and lines[1].startswith("# id_field:") else "id"


def learnt_secrets(tok: Path) -> set[int]:
    """The documents whose secret word the tokenizer at ``tok`` learnt, read from its files."""
    vocabulary = {base64.b64decode(line.split()[0]) for line in (tok / "tokenizer.tiktoken").read_text().splitlines()}
    files = b"".join((tok / name).read_bytes() for name in ("tokenizer.json", "merges.txt"))
    return {i for i in range(len(ROWS)) if secret(i).encode() in vocabulary
            or f" {secret(i)}".encode() in vocabulary or secret(i).encode() in files}


def check_training(tok: Path, logged: set[str], field: str, where: str) -> None:
    """A tokenizer trained with the tree's log learnt nothing of a document the log names."""
    out_docs = {i for i, r in enumerate(ROWS) if r[field] in logged}
    learnt = learnt_secrets(tok)
    assert not learnt & out_docs, f"{where}: learnt the secrets of removed documents {sorted(learnt & out_docs)}"
    assert learnt, f"{where}: no document's secret was learnt, so the check above could not fail"
    stats = (tok / "training_stats.txt").read_text()
    assert f"documents dropped (removed): {len(out_docs)}" in stats or not out_docs, stats


def holding(out, ids) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(out):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, out)
            if rel == "removals.txt":
                continue
            data = open(path, "rb").read()
            found += [f"{rel}: {i}" for i in ids if i.encode() in data]
    return found


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEQUENCES))
def test_no_accepted_removal_is_lost(seed, tmp_path):
    rng = random.Random(seed)
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    out = tmp_path / "out"
    assert run(["bucketed", "--input", str(src), "--output", str(out), "--partitions", "2", RUNNER], 0) == 0
    accepted: set[str] = set()
    ever: list[str] = log_lines(out)
    previous = None
    for step in range(STEPS):
        ids = rng.sample([r["id"] for r in ROWS], 3) + ["never-stored"]
        flagged = tmp_path / f"flagged-{step}.txt"
        flagged.write_text("\n".join(ids) + "\n")
        choice = rng.choice(["bucketed", "bucketed-list", "remove", "remove", "train-bpe", "export", "stats",
                             "resume"])
        if choice == "resume" and previous is not None:
            args, list_ids = previous
        elif choice.startswith("bucketed"):
            args = ["bucketed", "--input", str(src), "--output", str(out), "--partitions", str(rng.choice([2, 3])),
                    "--max-shard-bytes", str(rng.choice([1200, 4000, 1_500_000_000])),
                    "--id-field", rng.choice(["id", "id", "doc_key"]), RUNNER]
            list_ids = []
            if choice == "bucketed-list":
                args[-1:-1] = ["--removal-list", str(flagged)]
                list_ids = ids
        elif choice == "train-bpe":
            args = ["train-bpe", "--input", str(src), "--output", str(tmp_path / f"tok-{step}"), "--merges", "400",
                    "--removal-list", str(out), "--id-field", log_field(out), RUNNER]
            list_ids = []
        elif choice == "export":
            args, list_ids = ["export", "megatron", "--output", str(out)], []
        elif choice == "stats":
            args, list_ids = ["stats", "--output", str(out), "--png", "none"], []
        else:
            args, list_ids = ["remove", "--output", str(out), "--removal-list", str(flagged), RUNNER], ids
        kill_after = rng.choice([0, 0, rng.randint(1, 40)])
        code = run(args, kill_after)
        previous = (args, list_ids)
        accepted |= journal_ids(out)
        if code == 0:
            accepted |= {i for i in list_ids if i != "never-stored"}
        lines = log_lines(out)
        assert set(ever) <= set(lines), f"seed {seed} step {step} ({choice}): removals.txt lost lines"
        ever = lines
        finished = (out / "dataset_stats.txt").exists() and not journal_ids(out)
        if code == 0 and finished:
            assert holding(out, accepted) == [], f"seed {seed} step {step} ({choice})"
        if code == 0 and args[0] == "train-bpe":
            logged = {line.split(" | ")[2] for line in ever[2:]} | journal_ids(out)  # a pending removal's too
            check_training(Path(args[args.index("--output") + 1]), logged, args[args.index("--id-field") + 1],
                           f"seed {seed} step {step} ({choice})")
