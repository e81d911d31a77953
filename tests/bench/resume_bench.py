"""The resume figure of issue 15: a run killed (SIGKILL) once 80% of its input units are done, then
run again, against a clean run of the same corpus; prints the BENCHMARKS.md row.

    .venv/bin/python tests/bench/resume_bench.py [--cache DIR] [--target-mb 160] [--corpus base|x3] [--at 0.8] [--floor]
        [--backend auto|quicktok|tiktoken]

Three runs of the bucketed job on the bench corpus (corpus.py), each the CLI in a subprocess on the
in-process FnApiRunner: a clean run; a run killed as soon as the fraction ``--at`` of the units
have their completion marker; the same command again, which resumes. The resumed run's wall time
is given as a fraction of the clean run's (target: 0.35 or less), and its output must be byte-
identical to the clean run's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

import corpus as corpus_mod  # noqa: E402
from run_bench import tree_digest  # noqa: E402

from shards import layout  # noqa: E402
from transforms.inputs.fields import ReadConfig  # noqa: E402
from transforms.inputs.plan import plan_input  # noqa: E402
from transforms.run import resume  # noqa: E402

JOB = [sys.executable, "-m", "pipelines.cli", "bucketed"]


def markers(output: Path) -> int:
    temp = output / layout.TEMP_DIR_NAME
    return sum(1 for p in temp.glob(f"{resume.WORK_PREFIX}*/{resume.UNITS_DIR}/*{resume.MARKER_SUFFIX}"))


def timed_run(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return seconds, proc.stderr


def killed_run(cmd: list[str], output: Path, units: int) -> tuple[float, int]:
    """Start the job and SIGKILL it once ``units`` markers exist; its wall time until then, and the
    markers there are after the kill."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    while proc.poll() is None and markers(output) < units:
        time.sleep(0.05)
    if proc.poll() is not None:
        raise RuntimeError("the job ended before it could be killed")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return time.perf_counter() - start, markers(output)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench")
    p.add_argument("--target-mb", type=float, default=160.0)
    p.add_argument("--corpus", choices=("base", "x3"), default="base", help="x3: the corpus three times over")
    p.add_argument("--at", type=float, default=0.8, help="share of the input units done when the run is killed")
    p.add_argument("--floor", action="store_true",
                   help="also kill once every unit is done: what a resumed run costs with nothing left to tokenize")
    p.add_argument("--backend", default="auto", choices=("auto", "quicktok", "tiktoken"),
                   help="the job's --tokenizer-backend (tiktoken: the reference, slower than quicktok)")
    args = p.parse_args(argv)
    corpus_dir, info = corpus_mod.ensure(args.cache, args.target_mb)
    base = corpus_dir / args.corpus
    mb = info["text_bytes"] / 1e6 * (3 if args.corpus == "x3" else 1)
    total = len(plan_input(ReadConfig(str(base))))
    work = args.cache / "runs" / "resume"
    clean_out = work / "clean"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    flags = ["--runner=FnApiRunner", "--tokenizer-backend", args.backend]
    print(f"corpus: {args.corpus}, {mb:.0f} MB of text, {total} input units; --tokenizer-backend {args.backend}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)

    clean_s, _ = timed_run([*JOB, "--input", str(base), "--output", str(clean_out), *flags])
    print(f"clean run: {clean_s:.1f} s", flush=True)
    rows, identical_all = [], True
    for share in (args.at, 1.0) if args.floor else (args.at,):
        out = work / f"resumed-{share:g}"
        cmd = [*JOB, "--input", str(base), "--output", str(out), *flags]
        killed_s, done = killed_run(cmd, out, max(1, round(share * total)))
        print(f"killed after {killed_s:.1f} s with {done} of {total} units done", flush=True)
        resumed_s, stderr = timed_run(cmd)
        said = next((line.split(": ", 2)[-1] for line in stderr.splitlines() if "resuming:" in line), "no resume line")
        print(f"resumed run: {resumed_s:.1f} s ({said})", flush=True)
        identical = tree_digest(clean_out) == tree_digest(out)
        identical_all &= identical
        ratio = resumed_s / clean_s
        verdict = "met" if ratio <= 0.35 else "NOT met"
        rows.append(f"| resume after a kill -9 at {done}/{total} units ({done / total:.0%}), {mb:.0f} MB, FnApiRunner "
                    f"1 worker, {args.backend} | {clean_s:.1f} s | {resumed_s:.1f} s | {ratio:.2f} | <= 0.35: "
                    f"{verdict} | {'identical' if identical else 'DIFFERENT'} |")
    print()
    print("| figure | clean run | resumed run | resumed / clean | target | bytes |")
    print("|---|---:|---:|---:|---|---|")
    print("\n".join(rows))
    return 0 if identical_all else 1


if __name__ == "__main__":
    sys.exit(main())
