"""Issue 35, case 9d: a tokenizer file rewritten while a two-worker run reads it fails the run in
one line. The launch records the sha256 of each file the tokenizer is built from; each worker
checks it when it loads the tokenizer (transforms.tokenizers.load.check_unchanged). Beam's worker
processes still print their own traceback of the failed bundle (not the command's report)."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import GPT2_RANKS, REPO, SAMPLE_PARQUET
from test_lock import PAUSED_DRIVER, PIPELINE_RUN

from shards import layout

TWO_WORKERS = ["--runner=FnApiRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def test_a_tokenizer_rewritten_during_a_two_worker_run_fails_it_in_one_line(tmp_path):
    ranks = tmp_path / "gpt2.tiktoken"
    ranks.write_bytes(GPT2_RANKS.read_bytes())
    out = tmp_path / "out"
    go, paused = tmp_path / "go", tmp_path / "paused"
    args = ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--partitions", "2",
            "--tokenizer", f"tiktoken:{ranks}", *TWO_WORKERS]
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_DRIVER, str(go), str(paused), PIPELINE_RUN, *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not paused.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    # The launch loaded it; now two ranks swap places (the same size, other tokens).
    lines = ranks.read_bytes().splitlines(keepends=True)
    first, second = lines[300].split(b" "), lines[301].split(b" ")
    lines[300], lines[301] = first[0] + b" " + second[1], second[0] + b" " + first[1]
    ranks.write_bytes(b"".join(lines))
    go.touch()
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-3000:]
    said = [line for line in err.strip().splitlines() if line.startswith("pretokenize")]
    # Beam's SDK worker process prints the traceback of any bundle that fails to its own stderr
    # (sdk_worker.SdkHarness._execute), which the worker processes share with the launcher: the
    # command's own report is this one line.
    assert len(said) == 1, err[-3000:]
    assert f"--tokenizer tiktoken:{ranks}" in said[0] and "the tokenizer changed while the job ran" in said[0]
    assert "nothing was published" in said[0]
    assert not (out / layout.STATS_NAME).exists()
