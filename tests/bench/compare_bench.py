"""The bucketed job against a named earlier commit, in one sitting: so a regression shows as a ratio.

    python tests/bench/compare_bench.py --against 4798ec5 [--corpus scale|x4] [--documents 2000000]
                                        [--repeats 2] [--cache DIR] [--keep-trees] [--this COMMIT]

Absolute seconds drift with the machine's load (it is shared); a ratio taken in one sitting, the
two codes' runs interleaved (this checkout, the other, this checkout, ...), best of N each, does
not. The other commit is taken with ``git archive`` into the cache and run from a scratch venv
made there: an interpreter of its own (``python -m venv --without-pip``) that sees this venv's
installed dependencies (a .pth line adds its site-packages) and, first on its path, the archived
code, so neither checkout's editable install is what runs. A commit whose dependencies differ
from this venv's is not measured fairly this way: its pins are printed when they differ.

Each run: ``pretokenize bucketed`` on the FnApiRunner in one process (tests/bench/monitor.py: wall,
peak RSS of every process sampled every 0.1 s, the publish step's seconds timed inside the job);
documents/s is documents read over the wall. The
load average (1 min) before each run is printed, and the ratios of the best runs (this checkout
over the other: documents/s, wall, peak RSS). The trees written must be the same bytes: the
sha256 of every file a consumer reads (shards, processed_spec.txt, processed_spec.idx) is printed
per code, and said to be the same as this checkout's or not (an older commit may write other
bytes: 4798ec5 wrote no index); the script fails when one code wrote other bytes in another run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import monitor  # noqa: E402
import scale_corpus  # noqa: E402

# The job in this process, its publish step timed (transforms.core.publish.publish, the serial step
# after the parallel ones: what issue 38 measures), the seconds written to stderr.
JOB_CODE = """
import sys, time
import transforms.core.publish as core_publish
untimed = core_publish.publish
def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
        return untimed(*args, **kwargs)
    finally:
        print(f"publish seconds: {time.perf_counter() - start:.3f}", file=sys.stderr, flush=True)
core_publish.publish = timed
from pipelines.cli import main
sys.exit(main())
"""
PUBLISH_LINE = re.compile(r"^publish seconds: ([0-9.]+)$", re.M)
# The files of a tree a consumer reads: the rest (stats, card, record) name versions and times.
CONSUMED_SUFFIXES = (".npy",)
CONSUMED_NAMES = ("processed_spec.txt", "processed_spec.idx")


class Code(NamedTuple):
    """A checkout to run: its name, the interpreter, and the directory first on its path."""

    name: str
    python: str
    source: Path


class Run(NamedTuple):
    wall: float
    peak_rss: int
    load: float
    tree_sha256: str
    publish: float  # seconds in the publish step


def archived(commit: str, cache: Path) -> Path:
    """``commit``'s files (git archive), extracted once into the cache."""
    full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()
    target = cache / f"src-{full[:12]}"
    if not (target / "pipelines").is_dir():
        tmp = cache / f".src-{full[:12]}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", full], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def scratch_venv(cache: Path) -> str:
    """The scratch venv's interpreter: made once, it sees this venv's site-packages (not its code)."""
    venv = cache / "scratch-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        here = sysconfig.get_paths()["purelib"]
        Path(site, "bench_deps.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return str(python)


def pins_differ(source: Path) -> bool:
    """Whether the other commit's pyproject.toml pins other dependencies than this checkout's."""
    def deps(path: Path) -> list:
        import tomllib

        return tomllib.loads(path.read_text())["project"]["dependencies"]
    return deps(source / "pyproject.toml") != deps(REPO / "pyproject.toml")


def tree_sha256(root: Path) -> str:
    """One sha256 over the names and bytes of the files a consumer reads, in name order."""
    digest = hashlib.sha256()
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and
                   (p.suffix in CONSUMED_SUFFIXES or p.name in CONSUMED_NAMES) and not p.name.startswith("."))
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(root / name, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def run_once(code: Code, corpus: Path, output: Path, keep: bool) -> Run:
    """One job of ``code`` on ``corpus`` into a fresh ``output``."""
    shutil.rmtree(output, ignore_errors=True)
    load = os.getloadavg()[0]
    usage = monitor.run([code.python, "-c", JOB_CODE, "bucketed", "--input", str(corpus), "--output", str(output),
                         "--runner=FnApiRunner"], env={"PYTHONPATH": str(code.source)}, cwd=str(code.source))
    if usage.returncode != 0:
        raise RuntimeError(f"{code.name} failed ({usage.returncode}):\n{usage.stderr[-4000:]}")
    digest = tree_sha256(output)
    if not keep:
        shutil.rmtree(output, ignore_errors=True)
    publish = sum(float(s) for s in PUBLISH_LINE.findall(usage.stderr))
    return Run(usage.wall_seconds, max(p.peak_rss for p in usage.processes), load, digest, publish)


def corpus_of(args) -> tuple[Path, int]:
    """The corpus directory and its documents."""
    if args.corpus == "scale":
        data, info = scale_corpus.ensure(args.cache, args.documents)
        return data, info["documents"]
    import corpus as corpus_mod
    import pyarrow.parquet as pq
    from speed_bench import four_times

    base, _ = corpus_mod.ensure(args.cache, args.target_mb)
    data = four_times(base)
    return data, sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(data.rglob("*.parquet")))


def compare(codes: list[Code], corpus: Path, documents: int, repeats: int, cache: Path, keep: bool) -> dict:
    """Every code ``repeats`` times, interleaved; the runs of each, printed as they finish."""
    runs: dict[str, list[Run]] = {c.name: [] for c in codes}
    for r in range(repeats):
        for code in codes:
            run = run_once(code, corpus, cache / "runs" / f"compare-{code.name}", keep)
            runs[code.name].append(run)
            print(f"  round {r + 1} {code.name:>12}: {run.wall:6.1f} s  {documents / run.wall:9,.0f} documents/s  "
                  f"publish {run.publish:.1f} s ({run.publish / run.wall:.0%})  peak RSS {run.peak_rss >> 20} MiB  "
                  f"load {run.load:.2f}  tree {run.tree_sha256[:16]}", flush=True)
    return runs


def report(runs: dict, documents: int) -> tuple[str, bool]:
    """The best run of each code, the ratios of the first (this checkout) over the others, and
    whether every run wrote the same bytes."""
    names = list(runs)
    best = {n: min(rs, key=lambda r: r.wall) for n, rs in runs.items()}
    peak = {n: min(r.peak_rss for r in rs) for n, rs in runs.items()}
    lines = ["| code | best wall s | documents/s | its publish step (share) | peak RSS (lowest) | "
             "load average (1 min) at its runs |", "|---|---:|---:|---:|---:|---|"]
    for n in names:
        loads = ", ".join(f"{r.load:.1f}" for r in runs[n])
        b = best[n]
        lines.append(f"| {n} | {b.wall:.1f} | {documents / b.wall:,.0f} | {b.publish:.1f} s "
                     f"({b.publish / b.wall:.0%}) | {peak[n] >> 20} MiB | {loads} |")
    me = names[0]
    for other in names[1:]:
        lines.append(f"\n{me} over {other}: documents/s **{best[other].wall / best[me].wall:.2f}x**, "
                     f"wall {best[me].wall / best[other].wall:.2f}x, peak RSS {peak[me] / peak[other]:.2f}x")
    steady = all(len({r.tree_sha256 for r in rs}) == 1 for rs in runs.values())
    mine = runs[me][0].tree_sha256
    lines.append("\ntrees (shards, manifest, index), sha256: " + "; ".join(
        f"{n} {rs[0].tree_sha256[:16]}" + ("" if n == me else " (the same bytes)" if rs[0].tree_sha256 == mine
                                          else " (other bytes)") for n, rs in runs.items()))
    if not steady:
        lines.append("**a code wrote other bytes in another run**")
    return "\n".join(lines), steady


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", action="append", required=True, help="a commit (repeat for more than one)")
    p.add_argument("--this", help="a commit to run in place of this checkout's files (archived as the others)")
    p.add_argument("--corpus", choices=("scale", "x4"), default="scale")
    p.add_argument("--documents", type=int, default=scale_corpus.DEFAULT_DOCUMENTS)
    p.add_argument("--target-mb", type=float, default=160.0, help="the x4 corpus's base size (speed_bench.py)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench")
    p.add_argument("--keep-trees", action="store_true", help="leave the last tree of each code in the cache")
    args = p.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    corpus, documents = corpus_of(args)
    python = scratch_venv(args.cache)
    codes = [Code(args.this, python, archived(args.this, args.cache)) if args.this else
             Code("this checkout", sys.executable, REPO)]
    for commit in args.against:
        source = archived(commit, args.cache)
        if pins_differ(source):
            print(f"  note: {commit}'s pyproject.toml pins other dependencies; it runs with this venv's", flush=True)
        codes.append(Code(commit, python, source))
    print(f"{args.corpus} corpus, {documents:,} documents ({corpus}); {args.repeats} rounds, interleaved", flush=True)
    runs = compare(codes, corpus, documents, args.repeats, args.cache, args.keep_trees)
    text, steady = report(runs, documents)
    print(text)
    return 0 if steady else 1


if __name__ == "__main__":
    sys.exit(main())
