"""The bucketed job on the bench corpus in a real terminal (issue 37): tmux, 120 columns, one worker
then two.

    .venv/bin/python tests/bench/terminal_bench.py [--cache DIR] [--target-mb 160] [--repeats 1] [--size x3]

Each run is the CLI as a person types it, in a detached tmux session of its own (a pseudo-terminal,
so the progress bars are drawn), writing a fresh tree. The screen is read every ``POLL`` seconds
while it runs; at the end, the whole scrollback. Per run it reports the lines the run left on the
terminal, those of them Beam's SDK harness printed, and the job ETA the bar showed at 10%, 20%, ...
of the run's true wall time against the time truly left then. It checks the three figures of issue
37: two workers print no more lines than one and none of the harness's, and the bar's job ETA is
shown by 20% of the run and within 30% of the true time left at 50%. Prints, writes nothing else.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

import corpus as corpus_mod  # noqa: E402

COLUMNS, ROWS = 120, 50
POLL = 0.2  # a tenth of the 20% a bar must be up by, on a 10 s run
HARNESS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):|sdk harness|Logging handler created|control channel|"
                     r"apitools not found|Traceback")
ETA = re.compile(r"job ETA (~?)((?:\d+[dhms])+)")  # ~: the kept runs' estimate (pipelines/progress_prior.py)
BAR = re.compile(r"^read and ", re.MULTILINE)
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def seconds(text: str) -> int:
    """The seconds of a duration as transforms.core.progress.format_duration writes it (``1m05s``)."""
    return sum(int(n) * UNITS[u] for n, u in re.findall(r"(\d+)([dhms])", text))


def tmux(socket: str, *args: str, check: bool = True) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], check=check, capture_output=True, text=True).stdout


def run_in_terminal(socket: str, argv: list[str], scratch: Path) -> tuple[float, list[tuple], str]:
    """(wall seconds, [(seconds since the start, the job ETA on screen or None, "~" when it is marked an
    estimate, whether a bar is on screen)], the scrollback) of ``argv`` run in a fresh 120-column tmux
    session. The run's clock is the shell's: from just before the command starts (the time the tmux
    server takes to come up is no part of it) to when its exit code is written."""
    done, began, conf = scratch / "exit-code", scratch / "began", scratch / "tmux.conf"
    done.unlink(missing_ok=True)
    began.unlink(missing_ok=True)
    conf.write_text("set -g history-limit 100000\n")  # the whole run's lines kept, for the count
    command = (f"date +%s.%N > {_quote(str(began))}; " + " ".join(map(_quote, argv))
               + f"; echo $? > {_quote(str(done))}; sleep 86400")
    tmux(socket, "-f", str(conf), "new-session", "-d", "-s", "run", "-x", str(COLUMNS), "-y", str(ROWS),
         "bash", "--norc", "--noprofile", "-c", command)
    samples = []
    while not done.exists():
        screen = tmux(socket, "capture-pane", "-p", "-t", "run", check=False)
        found = ETA.findall(screen)
        samples.append((time.time(), seconds(found[-1][1]) if found else None,
                        found[-1][0] if found else "", bool(BAR.search(screen))))
        time.sleep(POLL)
    start = float(began.read_text())
    wall = done.stat().st_mtime - start
    samples = [(at - start, *rest) for at, *rest in samples if at >= start]
    scrollback = tmux(socket, "capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", "run")
    tmux(socket, "kill-server", check=False)
    code = done.read_text().strip()
    if code != "0":
        raise SystemExit(f"the run ended with exit code {code}:\n{scrollback}")
    return wall, samples, scrollback


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def eta_at(samples: list[tuple], wall: float, share: float) -> tuple[int | None, float, str]:
    """(the ETA on screen, the true seconds left, its mark) at the last sample before ``share`` of the run."""
    before = [s for s in samples if s[0] <= share * wall] or samples[:1]
    at, eta, mark, _ = before[-1]
    return eta, wall - at, mark


def one_run(workers: int, corpus: Path, scratch: Path, size: str = "base") -> dict:
    out = scratch / f"out-{workers}"
    shutil.rmtree(out, ignore_errors=True)
    local = ["--workers", str(workers)] if workers > 1 else ["--runner=FnApiRunner"]
    argv = [sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(corpus / size), "--output", str(out),
            *local]
    os.environ["PYTHONPATH"] = str(REPO)
    wall, samples, scrollback = run_in_terminal(f"pretokenize-bench-{os.getpid()}", argv, scratch)
    lines = [line for line in scrollback.splitlines() if line.strip()]
    etas = {share: eta_at(samples, wall, share / 100) for share in range(10, 100, 10)}
    shutil.rmtree(out, ignore_errors=True)
    bars = next((t for t, _, _, shown in samples if shown), wall)
    return {"workers": workers, "wall": wall, "lines": lines, "harness": [x for x in lines if HARNESS.search(x)],
            "etas": etas, "bars": bars}


def report(runs: list[dict]) -> bool:
    print(f"| workers | wall s | bars from | lines | harness lines | job ETA shown / true s left at "
          f"{', '.join(f'{s}%' for s in range(10, 100, 10))} |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in runs:
        cells = ", ".join(f"{'-' if eta is None else f'{mark}{eta}'}/{left:.0f}"
                          for eta, left, mark in r["etas"].values())
        print(f"| {r['workers']} | {r['wall']:.1f} | {100 * r['bars'] / r['wall']:.0f}% | {len(r['lines'])} "
              f"| {len(r['harness'])} | {cells} |")
    one = min(len(r["lines"]) for r in runs if r["workers"] == 1)
    met = True
    for r in (r for r in runs if r["workers"] == 2):
        eta20 = r["etas"][20][0]
        eta50, left50, _ = r["etas"][50]
        checks = {"no more lines than one worker": len(r["lines"]) <= one, "no line of the harness": not r["harness"],
                  "a job ETA by 20% of the run": eta20 is not None,
                  "the ETA at 50% within 30% of the time left": eta50 is not None
                  and abs(eta50 - left50) <= 0.3 * left50}
        for name, ok in checks.items():
            print(f"- 2 workers, {name}: {'met' if ok else 'NOT MET'}")
            met &= ok
    return met


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench")
    parser.add_argument("--target-mb", type=float, default=160.0)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each worker count, interleaved")
    parser.add_argument("--show", action="store_true", help="print each run's lines")
    parser.add_argument("--size", choices=("base", "x3"), default="base", help="the corpus, or it three times over")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed (apt-get install tmux)")
    corpus, info = corpus_mod.ensure(args.cache, args.target_mb)
    print(f"corpus: {info['documents']:,} documents, {info['text_bytes'] / 1e6:.1f} MB of text ({args.size}); "
          f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="pretokenize-terminal-") as scratch:
        for _ in range(args.repeats):
            for workers in (1, 2):
                runs.append(one_run(workers, corpus, Path(scratch), args.size))
                if args.show:
                    print("\n".join(runs[-1]["lines"]), flush=True)
    met = report(runs)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
