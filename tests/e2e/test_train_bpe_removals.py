"""train-bpe honours removal requests (issue 23, defect 4): a removed document's name and address
became tokens of the learnt vocabulary. Now ``--removal-list`` (a list, or an output tree: its
removals.txt) leaves its documents out before counting, as the bucketed job does, and the list's
sha256 is recorded in tokenizer_info.json and training_stats.txt. And Ctrl-C is one line."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO, finepdfs_row

from pipelines import cli

RUNNER = ["--runner=FnApiRunner"]
SECRET = "Quorvath Plinkerton quorvath.plinkerton@example.org"
ROWS = [finepdfs_row(f"doc-{i:02d}", f"An ordinary document number {i} about the weather and trains. " * 6)
        for i in range(30)]
ROWS.append(finepdfs_row("opt-out", f"{SECRET} wrote this. " * 80))
ROWS = [{**r, "doc_key": f"key-{i}"} for i, r in enumerate(ROWS)]  # a second id field


def train(source, out, *flags) -> int:
    return cli.main(["train-bpe", "--input", str(source), "--output", str(out), "--merges", "400", *flags, *RUNNER])


def vocabulary(out) -> list[bytes]:
    return [base64.b64decode(line.split()[0]) for line in (out / "tokenizer.tiktoken").read_text().splitlines()]


def learnt_the_secret(out) -> bool:
    files = b"".join((out / name).read_bytes() for name in ("tokenizer.json", "merges.txt"))
    return any(b"Plink" in t or b"orvath" in t for t in vocabulary(out)) or b"Plink" in files


def test_without_a_list_the_document_is_learnt(source, tmp_path):
    """The premise: the corpus makes the opt-out document's name a token."""
    assert train(source, tmp_path / "tok") == 0
    assert learnt_the_secret(tmp_path / "tok")


def test_a_removal_list_keeps_the_document_out_and_is_recorded(source, tmp_path):
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("opt-out\n")
    out = tmp_path / "tok"
    assert train(source, out, "--removal-list", str(flagged)) == 0
    assert not learnt_the_secret(out)
    info = json.loads((out / "tokenizer_info.json").read_text())
    digest = hashlib.sha256(flagged.read_bytes()).hexdigest()
    assert info["removal_list"] == {"source": str(flagged), "sha256": digest, "ids": 1}
    stats = (out / "training_stats.txt").read_text()
    assert "documents dropped (removed): 1" in stats and f"sha256 {digest}" in stats


def test_a_trees_removals_txt_keeps_its_documents_out(source, tmp_path):
    tree = tmp_path / "tree"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(tree), "--partitions", "2", *RUNNER]) == 0
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("opt-out\n")
    assert cli.main(["remove", "--output", str(tree), "--removal-list", str(flagged), *RUNNER]) == 0
    out = tmp_path / "tok"
    assert train(source, out, "--removal-list", str(tree)) == 0
    assert not learnt_the_secret(out)
    info = json.loads((out / "tokenizer_info.json").read_text())
    assert info["removal_list"]["sha256"] == hashlib.sha256((tree / "removals.txt").read_bytes()).hexdigest()


def test_a_trees_log_of_another_id_field_is_refused(source, tmp_path, capsys):
    tree = tmp_path / "tree"
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("opt-out\n")
    assert cli.main(["bucketed", "--input", str(source), "--output", str(tree), "--partitions", "2",
                     "--removal-list", str(flagged), *RUNNER]) == 0
    capsys.readouterr()
    assert train(source, tmp_path / "tok", "--removal-list", str(tree), "--id-field", "doc_key") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "values of the input field 'id'" in err[0]
    assert not (tmp_path / "tok").exists()


SLOW_COUNT = """
import sys, time
import transforms.bpe.count as count
real = count.CountWordsFn.process
def process(self, batch):
    open(sys.argv[1], "w").write("counting\\n")
    time.sleep(60)  # Ctrl-C arrives while a worker counts
    yield from real(self, batch)
count.CountWordsFn.process = process
from pipelines import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def test_ctrl_c_during_train_bpe_is_one_line(source, tmp_path):
    out = tmp_path / "tok"
    note = tmp_path / "note"
    args = ["train-bpe", "--input", str(source), "--output", str(out), "--merges", "50", *RUNNER]
    proc = subprocess.Popen([sys.executable, "-c", SLOW_COUNT, str(note), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None and not note.exists():
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("pretokenize train-bpe: interrupted; the previous tokenizer is intact"), last
