"""The performance benchmark behind issue 6: ``make bench``, or ``python tests/bench/run_bench.py``.

Every row of the table is measured in the same run, on the same corpus (tests/bench/corpus.py):

    raw tokenizer      the encoder the job loads, its library call (tiktoken ``encode_ordinary`` on NFC
                       text) over exactly the documents the job keeps, one core, in this process
    our encoder        ``Encoder.encode_arrays`` over the same documents in the job's batches: NFC, long
                       texts cut where ids cannot change, ids as a uint32 buffer
    bucketed job       ``pretokenize bucketed`` on the FnApiRunner, in a child process: one worker
                       in-process, then two worker processes, then two workers on the 3x corpus
    datatrove          datatrove's DocumentTokenizer over the same rows, same vocabulary (a tokenizer.json
                       converted from the same ranks), one task, one thread

Per core means tokens over CPU seconds (user + system, every process of the run, exact), next to
tokens over wall seconds times the cores the row may use. The machine's CPU time outside the run
is reported, since a busy neighbour inflates every wall-clock figure. Then each tokenizer backend
encodes 20 MB documents without whitespace, against ordinary text of the corpus, per byte.

Then the scale rehearsal of issue 12 (``--only scale`` runs just it): the bucketed job over N
(``--scale-docs``, 2,000,000 by default) short documents of 3 to 40 words (tests/bench/scale_corpus.py)
on the FnApiRunner with one worker, with two worker processes, and on Prism, each in a child process
watched by monitor.py: documents read per CPU second of the process tree and per wall second per core,
the peak RSS of every process, against the targets (every process < 600 MiB, >= 100,000 documents/s
per core). A run still going after ``--scale-timeout`` seconds is killed and recorded as such.

Then the tokenizer backends of issue 13 (``--only backends`` runs just it): tiktoken ``encode_ordinary``,
quicktok ``encode_ordinary`` and quicktok ``encode_batch`` (one thread, the job's batches of 64, NFC in
Python as the job does) over the kept documents, and the job end to end with ``--tokenizer-backend
tiktoken`` and ``quicktok``, one worker, on the base and the 3x corpus, against the target (the job at
least 0.70x quicktok ``encode_batch`` per CPU second on the 3x corpus). A run of the job on the bundled
sample gives its fixed cost (interpreter, Beam, the pipeline, loading the tokenizer and its probe).

It writes its sections of BENCHMARKS.md at the top of the checkout (the head, Targets, the long
documents, Tokenizer backends, Scale rehearsal; every other section, those added by hand among them,
stays as it is: report.py) and prints the same tables; ``--only scale``, ``--only backends`` and
``--only long`` rewrite only their section of it.
"""

from __future__ import annotations

import os

# One thread per tokenizer call, so that every per-core figure is one core's (tokenizers' Rust pool
# would otherwise take every core of the machine for a batch).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import base64  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import unicodedata  # noqa: E402
import urllib.parse  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import corpus as corpus_mod  # noqa: E402
import monitor  # noqa: E402
import report  # noqa: E402
import scale_corpus  # noqa: E402

from pipelines.summary import read_stats  # noqa: E402
from shards import conditions  # noqa: E402
from transforms.bucketed.filter import drop_masks  # noqa: E402
from transforms.bucketed.tokenize import TokenizerConfig  # noqa: E402
from transforms.inputs.fields import ReadConfig  # noqa: E402
from transforms.tokenizers.ranks import gpt2_ranks_path, qwen_ranks_path  # noqa: E402
from transforms.tokenizers.vocabularies import ENDOFTEXT, QWEN2_PATTERN  # noqa: E402

GPT2_RANKS = Path(gpt2_ranks_path())  # shipped in the package
MB = 1e6
GIB = 1 << 30
ORDINARY_SAMPLE_BYTES = 20_000_000
JOB = [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())", "bucketed"]
TWO_WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
MEMORY_TOLERANCE = 1.10  # "no larger" allows 10% for sampling and allocator noise
BUSY = 0.25  # cores busy elsewhere above which a job row is measured again
# Where `make prism` puts the binary (the Makefile's PRISM_BIN, tests/engines/engine_setup.py's too).
ENGINES_DIR = Path(os.environ.get("ENGINES_DIR", Path.home() / ".cache" / "beam-pretokenize"))
PRISM_BIN = ENGINES_DIR / f"prism-v{importlib.metadata.version('apache-beam')}" / "prism"
SCALE_RSS_LIMIT = 600 << 20  # issue 12: every process under 600 MiB
SCALE_DOCS_PER_CORE = 100_000  # issue 12: documents read per second per core, read to publish
SCALE_TIMEOUT = 600.0
SCALE_HEADING = "## Scale rehearsal: "
BACKENDS_HEADING = "## Tokenizer backends"
BACKEND_NAMED = ("dataset_stats.txt", "dataset_stats.json", "README.md")  # files that record the backend
BACKENDS_TARGET = 0.70  # issue 13: the job >= 0.70x quicktok encode_batch per CPU second, 3x corpus, 1 worker


@dataclasses.dataclass
class Row:
    name: str
    tokens: int  # text tokens, EOS not counted, so every row counts the same thing
    text_bytes: int
    wall: float
    cpu: float
    cores: int  # cores the row may use
    other_load: float = 0.0  # cores busy outside the run, on average
    steal_load: float = 0.0  # cores the hypervisor took, on average
    memory: str = ""

    @property
    def per_core_cpu(self) -> float:
        return self.tokens / self.cpu

    @property
    def per_core_wall(self) -> float:
        return self.tokens / (self.wall * self.cores)


# --- the documents the job keeps ---------------------------------------------------------------------------


def kept_texts(directory: Path) -> list[str]:
    """The texts of the rows the bucketed job keeps, with its own filter, in file order."""
    conds = conditions.conditions({})
    columns = ["text", *(f.name for f in ReadConfig("").filter_fields())]
    texts = []
    for path in sorted(directory.glob("*.parquet")):
        for batch in pq.read_table(path, columns=columns).to_batches():
            dropped = sum(drop_masks(batch.column, conds, batch.num_rows).values())
            texts += [t for t, d in zip(batch.column("text").to_pylist(), dropped.tolist(), strict=True) if not d]
    return texts


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def in_process_row(name: str, run, text_bytes: int, repeats: int) -> Row:
    """The best (least CPU) of ``repeats`` runs of ``run()`` in this process; it returns the token count."""
    best = None
    for _ in range(repeats):
        machine, steal = monitor.machine_cpu(), monitor.machine_steal()
        tokens, wall, cpu = timed(run)
        other = max(0.0, monitor.machine_cpu() - machine - cpu) / wall
        row = Row(name, tokens, text_bytes, wall, cpu, 1, other, (monitor.machine_steal() - steal) / wall)
        best = row if best is None or row.cpu < best.cpu else best
    return best


def raw_tokenizer_row(encoder, texts: list[str], text_bytes: int, repeats: int) -> Row:
    enc = encoder.backend

    def run() -> int:
        return sum(len(enc.encode_ordinary(unicodedata.normalize("NFC", t))) for t in texts)

    return in_process_row("raw tokenizer: tiktoken encode_ordinary (NFC), 1 core", run, text_bytes, repeats)


def encoder_row(encoder, texts: list[str], text_bytes: int, repeats: int) -> Row:
    def run() -> int:
        return sum(len(ids) for i in range(0, len(texts), 64) for ids in encoder.encode_arrays(texts[i:i + 64]))

    return in_process_row("our encoder: encode_arrays (NFC, cuts, uint32 buffer), 1 core", run, text_bytes, repeats)


# --- the job, datatrove ------------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def memory_text(usage: monitor.RunUsage) -> str:
    parts = [f"main {_mib(usage.peak('main'))}"]
    workers = [p.peak_rss for p in usage.processes if p.role == "worker"]
    if workers:
        parts.append("workers " + " / ".join(_mib(w) for w in workers))
    # A child seen only once or twice is a fork on its way to exec (Beam starts workers through /bin/sh).
    others = [p.peak_rss for p in usage.processes if p.role == "child" and p.samples >= 3]
    if others:
        parts.append("others " + " / ".join(_mib(w) for w in others))
    return ", ".join(parts)


def worker_peak(usage: monitor.RunUsage) -> int:
    """The largest process that runs the pipeline's DoFns: the workers, or main when it runs them."""
    workers = [p.peak_rss for p in usage.processes if p.role == "worker"]
    return max(workers) if workers else usage.peak("main")


def run_job(name: str, corpus_dir: Path, output: Path, extra: list[str], cores: int) -> tuple[Row, monitor.RunUsage]:
    """One run of the job; run again (once) when the rest of the machine was busy during it."""
    for attempt in range(2):
        shutil.rmtree(output, ignore_errors=True)
        usage = monitor.run(
            [*JOB, "--input", str(corpus_dir), "--output", str(output), "--runner=FnApiRunner", *extra]
        )
        if usage.returncode != 0 or usage.other_load <= BUSY or attempt:
            break
        print(f"  the machine was busy ({usage.other_load:.2f} cores elsewhere): running it again", flush=True)
    if usage.returncode != 0:
        raise RuntimeError(f"{name} failed ({usage.returncode}):\n{usage.stderr[-4000:]}")
    stats = read_stats(str(output))
    tokens = stats.total_tokens - stats.kept_documents
    row = Row(name, tokens, 0, usage.wall_seconds, usage.cpu_seconds, cores, usage.other_load, usage.steal_load,
              memory_text(usage))
    return row, usage


def tree_digest(output: Path, skip: tuple[str, ...] = ()) -> str:
    """sha256 over every published file but those named in ``skip``, by relative path."""
    h = hashlib.sha256()
    for path in sorted(p for p in output.rglob("*") if p.is_file() and p.name not in skip):
        h.update(str(path.relative_to(output)).encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def hf_tokenizer_dir(cache: Path) -> Path:
    """The Qwen2.5 ranks as a Hugging Face fast tokenizer, cached (as
    tests/transforms/tokenizers/test_encoders.py builds it)."""
    import tokenizers
    import transformers

    key = hashlib.blake2b(f"{qwen_ranks_path()}/{transformers.__version__}/{tokenizers.__version__}".encode(),
                          digest_size=6).hexdigest()
    path = cache / f"hf-qwen25-{key}"
    if (path / "tokenizer.json").is_file():
        return path
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(
        vocab_file=qwen_ranks_path(), pattern=QWEN2_PATTERN, extra_special_tokens=[ENDOFTEXT]
    ).converted()
    backend.normalizer = tokenizers.normalizers.NFC()
    tmp = cache / f".{path.name}.partial-{os.getpid()}"
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=ENDOFTEXT).save_pretrained(str(tmp))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def run_datatrove(corpus_dir: Path, tokenizer_json: Path, output: Path) -> tuple[Row, dict]:
    shutil.rmtree(output, ignore_errors=True)
    usage = monitor.run(
        [sys.executable, str(HERE / "datatrove_job.py"), str(corpus_dir), str(tokenizer_json), str(output)],
        env={"TOKENIZERS_PARALLELISM": "false"},
    )
    if usage.returncode != 0:
        raise RuntimeError(f"datatrove failed ({usage.returncode}):\n{usage.stderr[-4000:]}")
    result = json.loads(usage.stdout.strip().splitlines()[-1])
    tokens = result["tokens"] - result["documents"]
    name = "datatrove DocumentTokenizer (HF tokenizers), 1 task, 1 thread"
    row = Row(name, tokens, 0, usage.wall_seconds, usage.cpu_seconds, 1, usage.other_load, usage.steal_load,
              memory_text(usage))
    return row, result


# --- long documents without whitespace --------------------------------------------------------------------


def long_documents(corpus_dir: Path, texts: list[str], size: int) -> dict[str, str]:
    """Whitespace-free documents of ``size`` bytes, made from real bytes and text of the corpus."""
    raw = b"".join(p.read_bytes() for p in sorted(corpus_dir.glob("*.parquet")))  # zstd pages: random-looking

    def text_until(n: int, transform, cycle: bool = False) -> str:
        out, total = [], 0
        while total < n:
            for t in texts:
                piece = transform(t)
                out.append(piece)
                total += len(piece)
                if total >= n:
                    break
            if not cycle:
                break
        return "".join(out)[:n]

    def json_of(t: str) -> str:
        return json.dumps({"text": t}, separators=(",", ":")).replace(" ", "\\u0020") + ","

    docs = {
        "base64": base64.b64encode(raw[: size * 3 // 4]).decode("ascii"),
        "hex dump": raw[: size // 2].hex(),
        "long URL": "https://example.org/q?" + text_until(size, lambda t: urllib.parse.quote(t, safe="")),
        "minified JSON": "[" + text_until(size, json_of),
        "letters only": text_until(size, lambda t: re.sub(r"[^A-Za-z]+", "", t)),
        "punctuation only": text_until(size, lambda t: re.sub(r"[^!-/:-@\[-`{-~]+", "", t), cycle=True),
        "dot leaders": "." * size,
    }
    for name, doc in docs.items():
        doc = doc[:size]
        assert len(doc.encode("utf-8")) == size and not re.search(r"\s", doc), name
        docs[name] = doc
    return docs


def ordinary_sample(texts: list[str]) -> list[str]:
    out, size = [], 0
    for t in texts:
        out.append(t)
        size += len(t.encode("utf-8"))
        if size >= ORDINARY_SAMPLE_BYTES:
            break
    return out


def _cpu_us_per_byte(fn, *args, nbytes: int, repeats: int = 2) -> float:
    """CPU µs per byte of ``fn(*args)``, the best of ``repeats`` runs."""
    return min(timed(lambda: fn(*args))[2] for _ in range(repeats)) / nbytes * 1e6


def _encode_in_batches(encoder, texts: list[str]) -> None:
    for i in range(0, len(texts), 64):
        encoder.encode_arrays(texts[i:i + 64])


def _uncut(encoder, text: str) -> None:
    """The library's own call on the whole text."""
    if encoder.spec.startswith("hf:"):
        encoder.backend.encode_batch_fast([text], add_special_tokens=False)
    else:
        encoder.backend.encode_ordinary(text)


def long_doc_rows(specs: dict[str, tuple[str, str]], sample: list[str], docs: dict[str, str],
                  repeats: int) -> list[dict]:
    from transforms.tokenizers.load import load_encoder

    size = len(docs["dot leaders"])
    sample_bytes = sum(len(t.encode("utf-8")) for t in sample)
    rows = []
    for label, (spec, backend) in specs.items():
        encoder = load_encoder(spec, backend=backend)
        machine, steal, wall = monitor.machine_cpu(), monitor.machine_steal(), time.perf_counter()
        process = time.process_time()
        base = _cpu_us_per_byte(_encode_in_batches, encoder, sample, nbytes=sample_bytes, repeats=repeats)
        row = {"backend": label, "ordinary": base, "kinds": {}}
        for name, doc in docs.items():
            row["kinds"][name] = _cpu_us_per_byte(encoder.encode_arrays, [doc], nbytes=size, repeats=repeats)
        # What the cuts avoid: the library's own call on the letters document, whole (once: it is slow).
        row["uncut letters"] = _cpu_us_per_byte(_uncut, encoder, docs["letters only"], nbytes=size, repeats=1)
        wall = time.perf_counter() - wall
        row["busy"] = max(0.0, monitor.machine_cpu() - machine - (time.process_time() - process)) / wall
        row["stolen"] = (monitor.machine_steal() - steal) / wall
        rows.append(row)
        print(f"  {label}: ordinary {base:.3f} us/byte; "
              + ", ".join(f"{k} {v / base:.2f}x" for k, v in row["kinds"].items())
              + f"; letters uncut {row['uncut letters'] / base:.1f}x", flush=True)
    return rows


# --- the scale rehearsal (issue 12) ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScaleRunner:
    key: str  # as tests/engines names it
    name: str
    cores: int  # cores the run may use
    flags: tuple[str, ...]


SCALE_RUNNERS = {
    r.key: r
    for r in (
        ScaleRunner("fnapi-1", "FnApiRunner, 1 worker (in-process)", 1, ("--runner=FnApiRunner",)),
        ScaleRunner("fnapi-2proc", "FnApiRunner, 2 worker processes", min(2, os.cpu_count() or 1),
                    ("--runner=FnApiRunner", *TWO_WORKERS)),
        # LOOPBACK: the Python SDK worker runs in the launching process, Prism (Go) in its own.
        ScaleRunner("prism", f"Prism v{importlib.metadata.version('apache-beam')} (LOOPBACK worker)",
                    min(2, os.cpu_count() or 1),
                    ("--runner=PrismRunner", f"--prism_location={PRISM_BIN}", "--environment_type=LOOPBACK")),
    )
}


@dataclasses.dataclass
class ScaleRun:
    runner: ScaleRunner
    outcome: str  # finished, timeout, failed, not set up
    detail: str = ""
    usage: monitor.RunUsage | None = None
    read: int = 0
    kept: int = 0
    tokens: int = 0  # text tokens, EOS not counted
    digest: str = ""

    @property
    def cpu(self) -> float:
        """CPU seconds of the process tree: rusage of the reaped processes, or the sum of the sampled
        readings when that is larger (a process killed, or orphaned and reaped by init)."""
        return max(self.usage.cpu_seconds, self.usage.sampled_cpu_seconds)

    @property
    def per_core_cpu(self) -> float:
        return self.read / self.cpu

    @property
    def per_core_wall(self) -> float:
        return self.read / (self.usage.wall_seconds * self.runner.cores)

    def peaks(self) -> list[tuple[str, monitor.ProcessUsage]]:
        """Every process that lived at least 3 samples, labelled, largest first. A child seen once or
        twice is a fork on its way to exec (Beam starts workers through /bin/sh): its RSS is its
        parent's pages, not memory of its own."""
        labels, workers = [], 0
        for p in self.usage.processes:
            if p.role not in ("main", "worker") and p.samples < 3:
                continue
            if p.role == "worker":
                workers += 1
                label = f"worker {workers}"
            else:
                label = "main" if p.role == "main" else p.name or p.role
            labels.append((label, p))
        return sorted(labels, key=lambda lp: -lp[1].peak_rss)

    def memory_ok(self) -> bool:
        return all(p.peak_rss < SCALE_RSS_LIMIT for _, p in self.peaks())


def scale_run(runner: ScaleRunner, corpus_dir: Path, output: Path, timeout: float) -> ScaleRun:
    """One run of the job on ``runner``; run again (once) when the rest of the machine was busy."""
    if runner.key == "prism" and not os.access(PRISM_BIN, os.X_OK):
        return ScaleRun(runner, "not set up", f"no Prism binary at {PRISM_BIN} (`make prism` builds it)")
    for attempt in range(2):
        shutil.rmtree(output, ignore_errors=True)
        usage = monitor.run([*JOB, "--input", str(corpus_dir), "--output", str(output), *runner.flags],
                            timeout=timeout)
        if usage.timed_out or usage.returncode != 0 or usage.other_load <= BUSY or attempt:
            break
        print(f"  the machine was busy ({usage.other_load:.2f} cores elsewhere): running it again", flush=True)
    try:
        if usage.timed_out:
            return ScaleRun(runner, "timeout", f"did not finish in {timeout / 60:g} min", usage)
        if usage.returncode != 0:
            last = next((line for line in reversed(usage.stderr.splitlines()) if line.strip()), "")
            return ScaleRun(runner, "failed", f"failed (exit {usage.returncode}): {last[-300:]}", usage)
        stats = read_stats(str(output))
        return ScaleRun(runner, "finished", "", usage, stats.raw_documents, stats.kept_documents,
                        stats.total_tokens - stats.kept_documents, tree_digest(output))
    finally:
        shutil.rmtree(output, ignore_errors=True)


def code_version() -> str:
    """The commit of the code the job runs (the checkout ``pipelines`` is imported from), and whether
    its pipeline code has uncommitted changes: the code under the pipeline is often mid-rewrite."""
    import pipelines

    root = Path(pipelines.__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout

    try:
        sha = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", "pipelines", "transforms", "shards").strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"commit {sha}" + (" with uncommitted changes to pipelines/, transforms/ or shards/" if dirty else "")


def _docs_rate(x: float) -> str:
    return f"{x:,.0f}"


def scale_table(runs: list[ScaleRun]) -> list[str]:
    lines = [
        "| runner | documents read | kept | text tokens | wall s | CPU s (process tree) | cores "
        "| documents/s per core (CPU) | documents/s per core (wall) | largest process (peak RSS) "
        "| peak RSS of every process | every process < 600 MiB | busy elsewhere (stolen) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for r in runs:
        if r.usage is None:
            lines.append(f"| {r.runner.name} | {r.detail} |" + " |" * 12)
            continue
        u = r.usage
        peaks = r.peaks()
        label, big = peaks[0]
        largest = f"{_mib(big.peak_rss)}, {label}, at {big.peak_at / u.wall_seconds:.0%} of the wall time"
        every = "; ".join(f"{lbl} {_mib(p.peak_rss)}" for lbl, p in peaks)
        busy = f"{u.other_load:.2f} ({u.steal_load:.2f}) cores"
        if r.outcome == "finished":
            figures = (f"{r.read:,} | {r.kept:,} | {r.tokens:,} | {u.wall_seconds:.1f} | {r.cpu:.1f} "
                       f"| {r.runner.cores} | {_docs_rate(r.per_core_cpu)} | {_docs_rate(r.per_core_wall)}")
        else:
            figures = f"{r.detail} | | | {u.wall_seconds:.1f} | {r.cpu:.1f} | {r.runner.cores} | | "
        ok = "yes" if r.memory_ok() else "**no**"
        if r.outcome != "finished":
            ok += " (so far)" if r.memory_ok() else ""
        lines.append(f"| {r.runner.name} | {figures} | {largest} | {every} | {ok} | {busy} |")
    return lines


def scale_targets(runs: list[ScaleRun]) -> list[str]:
    lines = ["| target | runner | measured | |", "|---|---|---|---|"]
    for r in runs:
        if r.usage is None:
            lines.append(f"| every target | {r.runner.name} | {r.detail} | not measured |")
            continue
        finished = r.outcome == "finished"
        label, big = r.peaks()[0]
        memory = f"largest {_mib(big.peak_rss)} ({label})"
        memory_ok = finished and r.memory_ok()
        if not finished:
            memory += f"; {r.detail}"
        lines.append(f"| peak RSS of every process < 600 MiB | {r.runner.name} | {memory} | {met(memory_ok)} |")
        if finished:
            rate = (f"{_docs_rate(r.per_core_cpu)} per CPU second, {_docs_rate(r.per_core_wall)} per wall second "
                    f"x {r.runner.cores} core{'s' if r.runner.cores > 1 else ''}")
            rate_ok = r.per_core_cpu >= SCALE_DOCS_PER_CORE
        else:
            rate, rate_ok = r.detail, False
        lines.append(f"| >= 100,000 documents/s per core, read to publish | {r.runner.name} | {rate} "
                     f"| {met(rate_ok)} |")
    return lines


def scale_section(info: dict, runs: list[ScaleRun], date: str, how: str, timeout: float,
                  machine: str | None = None) -> list[str]:
    n = info["documents"]
    finished = [r for r in runs if r.outcome == "finished"]
    checks = []
    if finished:
        reads, kept = sorted({r.read for r in finished}), sorted({r.kept for r in finished})
        checks.append(f"documents read {n:,}" if reads == [n] else f"documents read {reads}, NOT the corpus's {n:,}")
        expected = info["kept_expected"]
        checks.append(f"kept {expected:,}, the confident English rows" if kept == [expected]
                      else f"kept {kept}, NOT the {expected:,} confident English rows")
        if len(finished) > 1:
            same = len({r.digest for r in finished}) == 1
            checks.append(f"the {len(finished)} finished runs wrote {'the same bytes' if same else 'DIFFERENT bytes'}")
    lines = [
        f"{SCALE_HEADING}{n:,} short documents",
        "",
        f"Measured {date} by {how}: the targets of issue 12, on the corpus of tests/bench/scale_corpus.py;"
        f" the job's code: {code_version()}.",
        "",
        *([f"Machine: {machine}.", ""] if machine else []),
        f"Corpus: {n:,} documents of {scale_corpus.MIN_WORDS} to {scale_corpus.MAX_WORDS} words, "
        f"{info['text_bytes'] / MB:.1f} MB of text, in the FinePDFs schema's columns the job reads, "
        f"{info['files']} parquet files, {info['row_groups']} row groups of at most "
        f"{scale_corpus.ROW_GROUP_ROWS:,} rows; each text a run of consecutive words of "
        "tests/data/sample_sources (English, or a UDHR translation in one of "
        f"{info['foreign_languages']} other languages); rows "
        + ", ".join(f"{k} {v:,}" for k, v in info["categories"].items())
        + ".",
        "",
        "One run of `pretokenize bucketed` per runner, in a child process, measured again once when the rest"
        " of the machine took more than a quarter of a core. CPU s: every process of the run (rusage of the"
        " reaped processes). Documents/s per core: documents read over those CPU seconds, and over the wall"
        " time times the cores the runner may use. Peak RSS: sampled every 0.1 s for every process of the run"
        " (processes seen fewer than 3 times, forks on their way to exec, left out), and when the largest"
        f" reached it. A run still going after {timeout / 60:g} minutes is killed.",
        "",
        *scale_table(runs),
        "",
    ]
    if checks:
        lines += ["Checks: " + "; ".join(checks) + ".", ""]
    lines += [
        "### Targets (scale rehearsal)",
        "",
        *scale_targets(runs),
        "",
    ]
    return lines


def run_scale(cache: Path, documents: int, runner_keys: list[str], timeout: float,
              date: str, how: str, machine: str | None = None) -> list[str]:
    """Build or reuse the scale corpus, run the job on each runner, return the BENCHMARKS.md section."""
    print(f"scale rehearsal: building or reusing {documents:,} short documents under {cache}", flush=True)
    corpus_dir, info = scale_corpus.ensure(cache, documents)
    print(f"scale rehearsal: {info['documents']:,} documents, {info['text_bytes'] / MB:.1f} MB, "
          f"{info['kept_expected']:,} to keep", flush=True)
    runs = []
    for key in runner_keys:
        runner = SCALE_RUNNERS[key]
        print(f"scale rehearsal: {runner.name} ...", flush=True)
        run = scale_run(runner, corpus_dir, cache / "runs" / f"scale-{key}", timeout)
        if run.outcome == "finished":
            big = run.peaks()[0]
            print(f"  {run.usage.wall_seconds:.1f} s wall, {run.cpu:.1f} CPU s, "
                  f"{run.per_core_cpu:,.0f} documents/s per CPU second; largest process {big[0]} "
                  f"{_mib(big[1].peak_rss)}", flush=True)
        else:
            print(f"  {run.detail}", flush=True)
        runs.append(run)
    return scale_section(info, runs, date, how, timeout, machine)


# --- tokenizer backends (issue 13) ---------------------------------------------------------------------


def _nfc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def backend_raw_rows(texts: list[str], text_bytes: int, repeats: int) -> list[Row]:
    """The libraries' own calls over the kept documents, NFC in Python inside the timing (the job
    normalizes too), one core: tiktoken and quicktok ``encode_ordinary``, quicktok ``encode_batch``."""
    tiktoken_enc = TokenizerConfig(backend="tiktoken").load().backend
    quicktok_enc = TokenizerConfig(backend="quicktok").load().backend

    def ordinary(enc):
        return lambda: sum(len(enc.encode_ordinary(_nfc(t))) for t in texts)

    def batch() -> int:
        return sum(len(quicktok_enc.encode_batch([_nfc(t) for t in texts[i:i + 64]], 1, False)[0])
                   for i in range(0, len(texts), 64))

    return [
        in_process_row("tiktoken encode_ordinary (NFC), 1 core", ordinary(tiktoken_enc), text_bytes, repeats),
        in_process_row("quicktok encode_ordinary (NFC), 1 core", ordinary(quicktok_enc), text_bytes, repeats),
        in_process_row("quicktok encode_batch (NFC, 64 documents a call, 1 thread), 1 core", batch, text_bytes,
                       repeats),
    ]


def run_backends(cache: Path, corpus_dir: Path, texts: list[str], text_bytes: int, repeats: int) -> list[str]:
    """The backends section: the raw rows, the job with each backend (1 worker, base and 3x corpus),
    the fixed cost of a run, the target; checks that the backends wrote the same bytes."""
    work = cache / "runs"
    print("tokenizer backends: the libraries' own calls ...", flush=True)
    tiktoken_raw, quicktok_ordinary, quicktok_batch = backend_raw_rows(texts, text_bytes, repeats)
    jobs: dict[tuple[str, str], Row] = {}
    digests: dict[str, set[str]] = {"base": set(), "x3": set()}
    for size in ("base", "x3"):
        for backend in ("tiktoken", "quicktok"):
            name = f"bucketed job, --tokenizer-backend {backend}, 1 worker" + (", 3x corpus" if size == "x3" else "")
            print(f"{name} ...", flush=True)
            output = work / f"backend-{backend}-{size}"
            row, _ = min((run_job(name, corpus_dir / size, output, ["--tokenizer-backend", backend], 1)
                          for _ in range(repeats)), key=lambda ru: ru[0].cpu)
            row.text_bytes = text_bytes * (3 if size == "x3" else 1)
            jobs[backend, size] = row
            # The stats (and the description) name the backend that wrote the tree; every other byte is the same.
            digests[size].add(tree_digest(output, skip=BACKEND_NAMED))
            shutil.rmtree(output)
    print("fixed cost: the job on the bundled sample ...", flush=True)
    fixed, _ = min((run_job("bucketed job on the bundled sample (fixed cost)", REPO / "tests" / "data"
                            / "finepdfs_sample.parquet", work / "backend-fixed", [], 1) for _ in range(repeats)),
                   key=lambda ru: ru[0].cpu)
    shutil.rmtree(work / "backend-fixed", ignore_errors=True)

    job3 = jobs["quicktok", "x3"]
    ratio = job3.per_core_cpu / quicktok_batch.per_core_cpu
    steady = job3.tokens / max(job3.cpu - fixed.cpu, 1e-9) / quicktok_batch.per_core_cpu
    encode_share = (job3.tokens / quicktok_batch.per_core_cpu) / job3.cpu
    same = all(len(d) == 1 for d in digests.values())
    token_counts = {r.tokens for r in (tiktoken_raw, quicktok_ordinary, quicktok_batch)}
    token_counts |= {jobs[b, "base"].tokens for b in ("tiktoken", "quicktok")}
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [tiktoken_raw, quicktok_ordinary, quicktok_batch, *jobs.values()]
    return [
        f"{BACKENDS_HEADING}",
        "",
        f"Measured {date}: the targets of issue 13, on the corpus above (the 3x corpus: the same rows three"
        " times). The libraries' rows encode exactly the documents the job keeps, in this process, with NFC in"
        " Python inside the timing as the job does; the job rows are `pretokenize bucketed --tokenizer-backend"
        f" B`, one worker in-process, the best of {repeats} runs. \"vs raw\" is against tiktoken"
        " `encode_ordinary`.",
        "",
        *rows_table(rows, tiktoken_raw),
        "",
        f"Fixed cost of a run (the interpreter, Beam, building the pipeline, loading the tokenizer and its probe):"
        f" {fixed.cpu:.1f} CPU s, measured as a run of the job on the bundled sample ({fixed.tokens:,} tokens).",
        "",
        "Checks: the job wrote the same bytes with either backend, but for the files that name it"
        f" ({', '.join(BACKEND_NAMED)}): {'yes' if same else 'NO'}; text tokens of every row"
        f" {'equal' if len(token_counts) == 1 else 'DIFFERENT'}"
        " on the base corpus.",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| job >= {BACKENDS_TARGET:.2f}x quicktok `encode_batch` per CPU second, 3x corpus, 1 worker"
        f" | {ratio:.2f}x ({job3.per_core_cpu / 1e6:.2f}M vs {quicktok_batch.per_core_cpu / 1e6:.2f}M tokens per"
        f" CPU second); without the fixed cost {steady:.2f}x; the tokenizer's own call is {encode_share:.0%} of"
        f" the job's CPU | {met(ratio >= BACKENDS_TARGET)} |",
        f"| job with quicktok faster than with tiktoken, 3x corpus | "
        f"{job3.per_core_cpu / jobs['tiktoken', 'x3'].per_core_cpu:.2f}x per CPU second"
        f" | {met(job3.per_core_cpu > jobs['tiktoken', 'x3'].per_core_cpu)} |",
    ]


# --- the report --------------------------------------------------------------------------------------------


def machine_text() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}" for p in ("apache-beam", "tiktoken", "tokenizers", "datatrove")
    )
    return (f"{os.cpu_count()} cores ({model}), {psutil.virtual_memory().total / GIB:.0f} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}; {versions}")


def rows_table(rows: list[Row], raw: Row) -> list[str]:
    lines = [
        "| row | text tokens | wall s | CPU s | tokens/s per core (CPU) | tokens/s per core (wall) "
        "| MB/s per core (CPU) | vs raw (CPU / wall) | busy elsewhere (stolen) | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        mbs = f"{r.text_bytes / MB / r.cpu:.2f}" if r.text_bytes else ""
        vs = f"{r.per_core_cpu / raw.per_core_cpu:.2f} / {r.per_core_wall / raw.per_core_wall:.2f}"
        lines.append(
            f"| {r.name} | {r.tokens:,} | {r.wall:.1f} | {r.cpu:.1f} | {r.per_core_cpu / 1e6:.2f}M "
            f"| {r.per_core_wall / 1e6:.2f}M | {mbs} | {vs} | {r.other_load:.2f} ({r.steal_load:.2f}) cores "
            f"| {r.memory} |"
        )
    return lines


def long_table(rows: list[dict]) -> list[str]:
    kinds = list(rows[0]["kinds"])
    lines = [
        "| backend | ordinary text µs/byte | " + " | ".join(kinds)
        + " | worst | letters, uncut | busy elsewhere (stolen) |",
        "|---|---:|" + "---:|" * len(kinds) + "---:|---:|---:|",
    ]
    for r in rows:
        base = r["ordinary"]
        ratios = [r["kinds"][k] / base for k in kinds]
        lines.append(
            f"| {r['backend']} | {base:.3f} | " + " | ".join(f"{x:.2f}x" for x in ratios)
            + f" | **{max(ratios):.2f}x** | {r['uncut letters'] / base:.1f}x"
            + f" | {r['busy']:.2f} ({r['stolen']:.2f}) cores |"
        )
    return lines


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def write_sections(out: Path, sections: list[list[str]], head: list[str] | None = None) -> None:
    """Rewrite only these sections of ``out`` (and its head, when given): every section this run did
    not measure, among them the ones added by hand, stays as it is (tests/bench/report.py)."""
    old = out.read_text() if out.is_file() else ""
    out.write_text(report.splice(old, sections, head))


def scale_only(args: argparse.Namespace, runner_keys: list[str], started: float) -> int:
    """``--only scale``: the scale rehearsal alone, its section of ``args.out`` rewritten in place."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    flags = ["--only scale"]
    if args.scale_docs != scale_corpus.DEFAULT_DOCUMENTS:
        flags.append(f"--scale-docs {args.scale_docs}")
    if runner_keys != list(SCALE_RUNNERS):
        flags.append(f"--scale-runners {','.join(runner_keys)}")
    if args.scale_timeout != SCALE_TIMEOUT:
        flags.append(f"--scale-timeout {args.scale_timeout:g}")
    command = f"`tests/bench/run_bench.py {' '.join(flags)}`"
    section = run_scale(args.cache, args.scale_docs, runner_keys, args.scale_timeout, date, command, machine_text())
    write_sections(args.out, [section])
    print("\n" + "\n".join(section))
    print(f"wrote the scale section of {args.out}; it took {(time.perf_counter() - started) / 60:.1f} minutes")
    return 0


LONG_HEADING = "## Long documents per backend"


def long_only(args: argparse.Namespace, started: float) -> int:
    """``--only long``: each jet-nemotron backend on the documents without whitespace, its section
    of ``args.out`` rewritten in place (the full bench's section covers every spec)."""
    corpus_dir, _ = corpus_mod.ensure(args.cache, args.target_mb)
    texts = kept_texts(corpus_dir / "base")
    specs = {"jet-nemotron, quicktok (no cuts)": ("jet-nemotron", "quicktok"),
             "jet-nemotron, tiktoken (cuts)": ("jet-nemotron", "tiktoken")}
    docs = long_documents(corpus_dir / "base", texts, int(args.long_doc_mb * MB))
    rows = long_doc_rows(specs, ordinary_sample(texts), docs, args.repeats)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = [
        LONG_HEADING,
        "",
        f"Measured by `tests/bench/run_bench.py --only long` {date}: as in the {args.long_doc_mb:g} MB section"
        " above, for each backend of jet-nemotron as the job runs it (quicktok without cuts: it is linear on"
        " long runs; tiktoken with the cuts of transforms.tokenizers.long_text). Each row is relative to that"
        " backend's own ordinary text; its µs/byte column compares the backends.",
        "",
        *long_table(rows),
    ]
    write_sections(args.out, [section])
    print("\n" + "\n".join(section))
    print(f"wrote the long-documents section of {args.out}; it took {(time.perf_counter() - started) / 60:.1f} minutes")
    return 0


def backends_only(args: argparse.Namespace, started: float) -> int:
    """``--only backends``: the tokenizer backends section alone, rewritten in place in ``args.out``."""
    corpus_dir, _ = corpus_mod.ensure(args.cache, args.target_mb)
    texts = kept_texts(corpus_dir / "base")
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    section = run_backends(args.cache, corpus_dir, texts, text_bytes, args.repeats)
    section[2] = section[2].replace("Measured ", "Measured by `tests/bench/run_bench.py --only backends` ", 1)
    write_sections(args.out, [section])
    print("\n" + "\n".join(section))
    print(f"wrote the backends section of {args.out}; it took {(time.perf_counter() - started) / 60:.1f} minutes")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench",
                   help="where the corpus, the converted tokenizer and the job outputs go")
    p.add_argument("--target-mb", type=float, default=160.0, help="MB of text in the base corpus (>= 150)")
    p.add_argument("--long-doc-mb", type=float, default=20.0, help="MB of each document without whitespace")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of the per-core rows (raw, encoder, 1-worker job, long documents); the best counts")
    p.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    p.add_argument("--only", choices=["scale", "backends", "long"],
                   help="run only this part and rewrite only its section of --out")
    p.add_argument("--scale-docs", type=int, default=scale_corpus.DEFAULT_DOCUMENTS,
                   help="documents in the scale rehearsal's corpus")
    p.add_argument("--scale-runners", default=",".join(SCALE_RUNNERS),
                   help=f"comma-separated runners of the scale rehearsal, of {', '.join(SCALE_RUNNERS)}")
    p.add_argument("--scale-timeout", type=float, default=SCALE_TIMEOUT,
                   help="seconds after which a scale run is killed and recorded as not finished")
    args = p.parse_args(argv)
    runner_keys = [k.strip() for k in args.scale_runners.split(",") if k.strip()]
    unknown = [k for k in runner_keys if k not in SCALE_RUNNERS]
    if unknown or not runner_keys:
        p.error(f"--scale-runners: unknown {unknown}; choose from {', '.join(SCALE_RUNNERS)}")
    if args.scale_docs < 1:
        p.error("--scale-docs must be at least 1")
    started = time.perf_counter()
    args.cache.mkdir(parents=True, exist_ok=True)
    work = args.cache / "runs"

    if args.only == "scale":
        return scale_only(args, runner_keys, started)
    if args.only == "backends":
        return backends_only(args, started)
    if args.only == "long":
        return long_only(args, started)

    print(f"corpus: building or reusing {args.target_mb:g} MB under {args.cache}", flush=True)
    corpus_dir, info = corpus_mod.ensure(args.cache, args.target_mb)
    base, x3 = corpus_dir / "base", corpus_dir / "x3"
    texts = kept_texts(base)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"corpus: {info['documents']:,} documents, {info['text_bytes'] / MB:.1f} MB; the job keeps "
          f"{len(texts):,} documents, {text_bytes / MB:.1f} MB", flush=True)

    # The reference backend: these rows are labelled tiktoken (the jobs below use the default, auto).
    encoder = TokenizerConfig(backend="tiktoken").load()
    print("raw tokenizer ...", flush=True)
    raw = raw_tokenizer_row(encoder, texts, text_bytes, args.repeats)
    ours = encoder_row(encoder, texts, text_bytes, args.repeats)
    del encoder

    # 1 and 2 workers on both corpora.
    jobs: dict[str, tuple[Row, monitor.RunUsage]] = {}
    digests: dict[str, set[str]] = {"base": set(), "x3": set()}
    for size, corpus_path in (("base", base), ("x3", x3)):
        for workers, extra in ((1, []), (2, TWO_WORKERS)):
            key = f"job{workers}{'' if size == 'base' else 'x3'}"
            name = f"bucketed job, {'1 worker (in-process)' if workers == 1 else '2 worker processes'}"
            name += ", 3x corpus" if size == "x3" else ""
            print(f"{name} ...", flush=True)
            # The 1-worker base run gives the per-core figures: the best of --repeats, like the raw rows.
            runs = args.repeats if (workers, size) == (1, "base") else 1
            row, usage = min(
                (run_job(name, corpus_path, work / key, extra, workers) for _ in range(runs)),
                key=lambda ru: ru[0].cpu,
            )
            row.text_bytes = text_bytes * (3 if size == "x3" else 1)
            jobs[key] = (row, usage)
            digests[size].add(tree_digest(work / key))
            shutil.rmtree(work / key)

    print("datatrove ...", flush=True)
    hf_dir = hf_tokenizer_dir(args.cache)
    dt, dt_result = run_datatrove(base, hf_dir / "tokenizer.json", work / "datatrove")
    dt.text_bytes = text_bytes

    print(f"{args.long_doc_mb:g} MB documents without whitespace ...", flush=True)
    # Each backend with what it needs: tiktoken with the cuts of transforms.tokenizers.long_text, quicktok
    # (linear on long runs, issue 13) with none.
    specs = {"jet-nemotron, quicktok (no cuts)": ("jet-nemotron", "quicktok"),
             "jet-nemotron, tiktoken (cuts)": ("jet-nemotron", "tiktoken"),
             "tiktoken:gpt2.tiktoken": (f"tiktoken:{GPT2_RANKS}", "tiktoken"),
             "hf: (Qwen2.5 tokenizer.json)": (f"hf:{hf_dir}", "tiktoken")}
    long_size = int(args.long_doc_mb * MB)
    long_rows = long_doc_rows(specs, ordinary_sample(texts), long_documents(base, texts, long_size), args.repeats)

    backend_lines = run_backends(args.cache, corpus_dir, texts, text_bytes, args.repeats)
    scale_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    scale_lines = run_scale(args.cache, args.scale_docs, runner_keys, args.scale_timeout, scale_date, "`make bench`")
    shutil.rmtree(work, ignore_errors=True)
    runtime = time.perf_counter() - started

    # --- targets
    def per_core(row: Row, ref: Row) -> tuple[float, str]:
        cpu, wall = row.per_core_cpu / ref.per_core_cpu, row.per_core_wall / ref.per_core_wall
        return cpu, f"{cpu:.2f}x per CPU second, {wall:.2f}x per wall second"

    def speedup(one: Row, two: Row) -> tuple[float, str]:
        x = one.wall / two.wall
        busy = f"busy elsewhere {one.other_load:.2f} / {two.other_load:.2f} cores"
        return x, f"{x:.2f}x ({one.wall:.1f} s -> {two.wall:.1f} s; {busy})"

    def peak(key: str) -> str:
        usage = jobs[key][1]
        in_process = re.search(r"1(x3)?$", key)  # one worker: the runner is the worker
        return _mib(worker_peak(usage)) + ("" if in_process else f" (runner {_mib(usage.peak('main'))})")

    def grows(small: str, large: str) -> bool:
        return worker_peak(jobs[large][1]) > worker_peak(jobs[small][1]) * MEMORY_TOLERANCE

    keys = ["job1", "job2", "job1x3", "job2x3"]
    one, two, one3, two3 = (jobs[k][0] for k in keys)
    vs_raw, vs_raw_text = per_core(one, raw)
    vs_dt, vs_dt_text = per_core(one, dt)
    scale, scale_text = speedup(one, two)
    scale3, scale3_text = speedup(one3, two3)
    targets = [
        ("end-to-end per-core throughput >= 0.85 of raw, 1 worker", vs_raw_text, vs_raw >= 0.85),
        ("faster per core than datatrove (1 worker)", vs_dt_text, vs_dt > 1.0),
        ("2 workers >= 1.7x one worker (wall), base corpus", scale_text, scale >= 1.7),
        ("2 workers >= 1.7x one worker (wall), 3x corpus", scale3_text, scale3 >= 1.7),
        ("peak memory of a worker < 1 GiB", "; ".join(f"{k} {peak(k)}" for k in keys),
         max(worker_peak(jobs[k][1]) for k in keys) < GIB),
        ("worker memory no larger for a 3x bigger input (10% allowed for noise)",
         f"1 worker: {peak('job1')} -> {peak('job1x3')}; 2 workers: {peak('job2')} -> {peak('job2x3')}",
         not grows("job1", "job1x3") and not grows("job2", "job2x3")),
    ]
    worst_long = {r["backend"]: max(v / r["ordinary"] for v in r["kinds"].values()) for r in long_rows}
    targets += [
        (f"{args.long_doc_mb:g} MB without whitespace <= 2x ordinary per byte: {name}", f"worst {w:.2f}x", w <= 2.0)
        for name, w in worst_long.items()
    ]
    same_output = all(len(d) == 1 for d in digests.values())

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        f"Measured {date} by `make bench` (tests/bench/, see its README) in {runtime / 60:.1f} minutes.",
        "",
        f"Machine: {machine_text()}.",
        "",
        f"Corpus: {info['documents']:,} documents, {info['text_bytes'] / MB:.1f} MB of real text from this machine "
        f"in the FinePDFs schema ({', '.join(f'{k} {v / MB:.1f} MB' for k, v in info['source_text_bytes'].items())}"
        f"); document sizes {info['document_bytes']['min']:,} B to {info['document_bytes']['max'] / MB:.1f} MB "
        f"(median {info['document_bytes']['p50']:,} B); rows "
        + ", ".join(f"{k} {v:,}" for k, v in info["categories"].items())
        + f". The job keeps {len(texts):,} documents, {text_bytes / MB:.1f} MB. The 3x corpus is the same rows"
        " three times under fresh ids.",
        "",
        "Every row below was measured in this one run. Per core: text tokens (EOS not counted) per CPU second of"
        " every process of the row (exact, from rusage), and per wall second times the cores the row may use."
        " \"Busy elsewhere\" is CPU the machine spent outside the row, in cores, and in parentheses the CPU the"
        " hypervisor gave other guests (steal). Other work slows the wall clock most, but on a virtual machine even"
        f" the CPU figures move by about 10% from run to run, so the per-core rows (raw, encoder, 1 worker on the"
        f" base corpus, long documents) are the best of {args.repeats} runs. Tokenizers run with"
        " TOKENIZERS_PARALLELISM=false (one thread).",
        "",
        *rows_table([raw, ours, *(row for row, _ in jobs.values()), dt], raw),
        "",
        f"Checks: the job's text tokens equal the raw tokenizer's ({one.tokens:,} vs {raw.tokens:,}: "
        f"{'equal' if one.tokens == raw.tokens else 'DIFFERENT'}); 1 and 2 workers wrote the same bytes "
        f"({'yes' if same_output else 'NO'});"
        f" datatrove wrote {dt_result['documents']:,} documents, "
        f"{dt.tokens:,} text tokens (its HF tokenizer and tiktoken differ on {abs(dt.tokens - raw.tokens):,} tokens).",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        *[f"| {name} | {figure} | {met(ok)} |" for name, figure, ok in targets],
        "",
        f"## {args.long_doc_mb:g} MB documents without whitespace",
        "",
        f"CPU time per byte of a {args.long_doc_mb:g} MB document of each kind, over the CPU time per byte of"
        " ordinary text (the"
        f" first {ORDINARY_SAMPLE_BYTES / MB:.0f} MB of the kept documents, in the job's batches), through"
        " `Encoder.encode_arrays`. The last column is the library's own call on the letters document, uncut.",
        "",
        *long_table(long_rows),
        "",
        *backend_lines,
        "",
        *scale_lines,
    ]
    text = "\n".join(lines)
    head, sections = report.split(text)
    write_sections(args.out, sections, head)
    print("\n" + text)
    print(f"wrote {args.out}; make bench took {runtime / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
