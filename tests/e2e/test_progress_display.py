"""The whole job's progress as a person sees it: bars in a terminal (a pseudo-terminal here), from
the first redraw to the publish, through reading and tokenizing then writing; one plain line a
stage when stderr is a file."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from conftest import REPO, SAMPLE_PARQUET, TerminalStream, bucketed_sample

from pipelines import cli
from pipelines.progress_display import JobDisplay, stage_figures
from transforms.core import progress
from transforms.core.progress import Progress, Stage, announce_stages

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(argv: list[str], env: dict, columns: int = 120, rows: int = 40) -> tuple[int, str]:
    """Runs argv with a pseudo-terminal of ``columns`` x ``rows`` as its stdin, stdout and stderr;
    its return code and everything it wrote there."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    child = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            out += chunk
        elif child.poll() is not None:
            break
    os.close(master)
    return child.wait(timeout=60), out.decode("utf-8", "replace")


def bar_frames(text: str, label: str) -> list[tuple[int, str]]:
    """(percentage, the frame's text) of every drawing of bar ``label``, in order."""
    frames = []
    for piece in re.split(r"[\r\n]", ANSI.sub("", text)):
        m = re.match(rf"{re.escape(label)}\s*:\s*(\d+)%\|", piece)
        if m:
            frames.append((int(m.group(1)), piece))
    return frames


def test_a_job_under_a_terminal_draws_both_stages_to_100_percent(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TERM": "xterm", progress.INTERVAL_ENV: "0"}
    out = tmp_path / "out"
    code, text = run_in_terminal([sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(SAMPLE_PARQUET),
                                  "--output", str(out), "--runner=FnApiRunner"], env)
    assert code == 0, text
    read, write = bar_frames(text, "read and tokenize"), bar_frames(text, "write")
    assert read and write, text
    for frames in (read, write):
        shares = [share for share, _ in frames]
        assert shares == sorted(shares), shares  # never goes back
        assert shares[0] == 0 and shares[-1] == 100
    assert "190/190" in read[-1][1] and "rows/s" in read[-1][1]
    assert "740k/740k" in write[-1][1] and "tokens/s" in write[-1][1] and "published" in write[-1][1]
    # Writing begins once reading has ended: the first drawing of a written share follows a full read bar.
    first_written = next(i for i, (share, _) in enumerate(bar_frames(text, "write")) if share > 0)
    plain = re.split(r"[\r\n]", ANSI.sub("", text))
    written_at = [i for i, piece in enumerate(plain) if re.match(r"write\s*:\s*([1-9]\d*)%", piece)][0]
    assert any(re.match(r"read and tokenize\s*:\s*100%", p) for p in plain[:written_at]), first_written
    # ETA and elapsed, as [elapsed<remaining, rate]
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d, ", read[-1][1])
    # The workers' own progress lines (every 0 s here) are held back while the bars are drawn.
    assert "[read pid" not in text and "[write pid" not in text
    assert "total" in text and (out / "dataset_stats.txt").exists()  # the summary, and the tree


def test_without_a_terminal_the_stages_are_plain_log_lines(tmp_path, capsys):
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"),
                     "--runner=FnApiRunner"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "%|" not in err
    (last,) = [line for line in err.splitlines() if "progress: " in line and "(published)" in line]
    assert re.search(r"progress: read and tokenize 100\.0% of 190 rows, ETA 0s; "
                     r"write 100\.0% of 740\.21k tokens, ETA 0s \(published\)$", last), last


def test_the_display_sums_every_worker_and_takes_the_write_total_from_the_tokens_made(tmp_path):
    shared = str(tmp_path)
    stages = [Stage("read and tokenize", "read", ("documents",), "rows", total=100),
              Stage("write", "write", ("tokens",), "tokens", total_step="tokenize", total_keys=("tokens",))]
    a, b = Progress("read", shared_dir=shared), Progress("read", shared_dir=shared)
    tok = Progress("tokenize", shared_dir=shared)
    a.add(documents=30)
    b.add(documents=20)
    tok.add(tokens=5000)
    progress.flush_all()
    assert stage_figures(shared, stages) == [(50, 100), (0, 5000)]
    w = Progress("write", shared_dir=shared)
    w.add(tokens=1000)
    w.flush()
    # Writing has begun, so reading has ended: the last read figures may not have been shared yet.
    assert stage_figures(shared, stages) == [(100, 100), (1000, 5000)]


def test_a_display_without_announced_stages_draws_nothing(tmp_path):
    import io

    stream = io.StringIO()
    with JobDisplay(str(tmp_path), stream=stream, interval=0):
        time.sleep(0.6)
    assert stream.getvalue() == ""


@pytest.mark.parametrize("label", ["read and tokenize", "write"])
def test_the_bars_of_a_display_end_full_when_the_job_has_published(tmp_path, label):
    announce_stages(str(tmp_path), [Stage("read and tokenize", "read", ("documents",), "rows", total=100),
                                    Stage("write", "write", ("tokens",), "tokens", total_step="tokenize",
                                          total_keys=("tokens",))])
    terminal = TerminalStream()
    with JobDisplay(str(tmp_path), stream=terminal):
        p, tok = Progress("read", shared_dir=str(tmp_path)), Progress("tokenize", shared_dir=str(tmp_path))
        p.add(documents=40)
        tok.add(tokens=500)
        progress.flush_all()
        time.sleep(0.3)
    frames = bar_frames(terminal.text, label)
    assert frames[-1][0] == 100
    assert label != "read and tokenize" or any(share == 40 for share, _ in frames)


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    return bucketed_sample(tmp_path_factory.mktemp("display") / "sample")


@pytest.mark.parametrize(("command", "label", "count", "ending"), [
    ("verify", "verify", "84/84", "done"),
    ("remove", "rewrite", "1/1", "published"),
    ("train-bpe", "read and count", "190/190", "counted"),
])
def test_remove_verify_and_train_bpe_draw_their_bars_to_100_percent(command, label, count, ending, sample_tree,
                                                                    tmp_path):
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(sample_tree, tree)
    first_id = (tree / "processed_spec.txt").read_text().splitlines()[1].split(" | ")[1]
    (tmp_path / "flagged.txt").write_text(first_id + "\n")
    argv = {
        "verify": ["--output", str(tree)],
        "remove": ["--output", str(tree), "--removal-list", str(tmp_path / "flagged.txt")],
        "train-bpe": ["--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "bpe"), "--merges", "300"],
    }[command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TERM": "xterm"}
    code, text = run_in_terminal([sys.executable, "-m", "pipelines.cli", command, *argv, "--runner=FnApiRunner"], env)
    assert code == 0, text
    frames = bar_frames(text, label)
    assert frames and frames[-1][0] == 100, text
    assert count in frames[-1][1] and ending in frames[-1][1], frames[-1][1]
    if command == "train-bpe":  # then the merges, learnt on the launcher
        merges = bar_frames(text, "merges")
        assert merges and merges[-1][0] == 100 and "300/300" in merges[-1][1], text


def test_an_error_in_the_display_stops_it_and_never_the_job(tmp_path, monkeypatch, capfd, caplog):
    """An error of the display's own (here: its figures unreadable) killed its thread with a
    traceback, and raised again from the end of the job, after the job had published: now one
    warning line, and the job's end goes on."""
    from pipelines import progress_display

    def broken(*args):
        raise ZeroDivisionError("a figure that cannot be divided")

    announce_stages(str(tmp_path), [Stage("read and tokenize", "read", ("documents",), "rows", total=100)])
    monkeypatch.setattr(progress_display, "stage_figures", broken)
    with caplog.at_level(logging.WARNING, logger="pretokenize.progress"):
        with JobDisplay(str(tmp_path), stream=TerminalStream()):
            time.sleep(0.4)
    assert "Traceback" not in capfd.readouterr().err
    said = [r.getMessage() for r in caplog.records]
    assert said and all(m == "the progress display stopped: ZeroDivisionError: a figure that cannot be divided"
                        for m in said), said


# A fresh interpreter, as a person's command starts: what it has imported when the display comes up
# and when the job's stages are first announced (the bars and the job ETA appear then).
LAUNCH_ORDER = """
import json, sys
from pipelines import cli, progress, progress_display

seen = []
announce = progress.announce_stages
def announced(*args, **kwargs):
    seen.append(("announced", "apache_beam" in sys.modules))
    return announce(*args, **kwargs)
progress.announce_stages = announced
enter = progress_display.JobDisplay.__enter__
def entered(self):
    seen.append(("display", "apache_beam" in sys.modules))
    return enter(self)
progress_display.JobDisplay.__enter__ = entered
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "seen": seen}))
"""


@pytest.mark.parametrize("job", ["bucketed", "scaffold"])
def test_the_bars_come_before_beam_is_imported(job, tmp_path, gpt2_spec):
    """Importing Beam takes a second of a ten-second run (issue 37: the bar then came at a fifth of a
    two-worker run of the bench corpus): the input is planned and the bars announced before it."""
    source = SAMPLE_PARQUET if job == "bucketed" else REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"
    argv = [job, "--input", str(source), "--output", str(tmp_path / "out"), "--runner=FnApiRunner",
            "--tokenizer", gpt2_spec]
    done = subprocess.run([sys.executable, "-c", LAUNCH_ORDER, *argv], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stderr
    # the display, then the planned work, with no Beam; announced again once the output is claimed
    assert result["seen"][:2] == [["display", False], ["announced", False]], result
    assert result["seen"][2:] == [["announced", True]], result
