"""The train-bpe job: learn a BPE tokenizer from a corpus; the words are counted on Beam.

    pretokenize train-bpe --input 'data/*.parquet' --output tok/ --vocab-size 32000 [--runner FnApiRunner ...]

What happens, in order:

1. Launch: the flags are checked, the input is planned (every file exists and has its columns), the
   output is claimed as a ``tokenizer`` tree (shards.tree) and a run directory made in its
   temporary directory.
2. The pipeline reads and filters documents as the bucketed job does (the same reader, field flags
   and language filter; ``--language none`` turns the filter off), cuts the texts into words and
   counts them (each input unit's steps run in one call, transforms.run.steps.RunUnits; then
   transforms.bpe.count's combiner per count shard), and writes the pruned count
   shards and the run's counts (documents, drops, characters, pre-tokens) into the run directory.
3. The launcher reads the counted words and learns the merges (transforms.bpe.learn).
4. It publishes: the record lists the files first; the old ``training_stats.txt`` goes, then
   tokenizer.tiktoken, tokenizer.json, merges.txt, tokenizer_config.json, special_tokens_map.json
   and tokenizer_info.json are written (each atomically), then ``training_stats.txt``, the commit
   point. The run directory is removed.

A run that fails or is interrupted before step 4 leaves the previous tokenizer as it was.
Flags this job does not know go to Beam's PipelineOptions (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import shlex
import time
from typing import TYPE_CHECKING

from pipelines import errors, flags, job, launch, progress, run_mode, summary
from pipelines.progress_display import LauncherBar
from shards import kinds, lock, storage, tree
from shards import tokenizer_files as files
from shards.removal.lists import (
    check_id_field,
    is_tree_source,
    log_ids,
    log_url_of,
    read_removal_source,
)
from shards.version import tool_version
from transforms.bpe import pretokenize
from transforms.bpe.learn import learn_merges
from transforms.bpe.settings import TrainBpeSettings
from transforms.bucketed.settings import DOCUMENT_FILTER_FLAGS
from transforms.core.records import UsageError

if TYPE_CHECKING:  # Beam and the graph are imported by build(): --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

log = logging.getLogger(__name__)

KIND = kinds.TOKENIZER.name
RUN_STATS_NAME = "run_stats.json"


def make_parser() -> argparse.ArgumentParser:
    p = flags.job_parser("train-bpe", "Learn a byte-pair-encoding tokenizer from parquet/JSONL documents: words "
                          "counted on Beam, merges learnt on the launcher; writes tokenizer.tiktoken, tokenizer.json, "
                          "merges.txt, tokenizer_config.json and special_tokens_map.json (AutoTokenizer."
                          "from_pretrained loads the directory), tokenizer_info.json and training_stats.txt "
                          "into --output.",
                          resumable=False)
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--vocab-size", dest="vocab_size", type=int,
                      help="every id, the EOS included: base symbols + merges + 1")
    size.add_argument("--merges", dest="merges", type=int, help="the number of merges to learn")
    own = ("pattern", "alphabet", "min_count", "max_words", "count_shards", "eos_token", "removal_list")
    flags.add_setting_flags(p, TrainBpeSettings, own + DOCUMENT_FILTER_FLAGS + ("on_bad_record",))
    return p


def parse_args(argv: list[str]) -> tuple[TrainBpeSettings, PipelineOptions]:
    return flags.parse_settings(make_parser(), argv, TrainBpeSettings)


def _stopped(output: str, run_id: str, error: BaseException, interrupted: bool) -> errors.RunStopped | None:
    """A failed or interrupted run's temporary files deleted; a RunStopped saying what the output
    holds, or None: the error is raised as it is."""
    published, _ = launch.abandon_run(output, run_id)
    state = ("the tokenizer is unfinished (publishing had begun, so it has no training_stats.txt): run the "
             "same command again" if published else "the previous tokenizer is intact")
    return errors.stopped_line(error, output, interrupted, f"{state}; the run's temporary files were deleted")


def run_url(output: str, run_id: str) -> str:
    return storage.join(output, tree.Tree.temp_name(run_id))


def build(pipeline: beam.Pipeline, options: TrainBpeSettings, run_id: str, mode: run_mode.RunMode = run_mode.RUN):
    """Adds the counting to ``pipeline`` (pipelines/train_bpe_graph.py), the run's numbers to RUN_STATS_NAME."""
    from pipelines import train_bpe_graph

    counting = options.count_config(run_url(storage.normalize(options.output), run_id))
    return train_bpe_graph.build(pipeline, options, run_id, mode, counting,
                                 storage.join(counting.run_url, RUN_STATS_NAME))


def removal_record(options: TrainBpeSettings) -> dict | None:
    """What tokenizer_info.json and training_stats.txt record of the --removal-list: where it was,
    the sha256 of its bytes (a tree's: of its removals.txt), how many ids. Read at launch, where the
    ids it is checked for are read; a list of ids of another --id-field than this run's is refused."""
    if not options.removal_list:
        return None
    url = storage.normalize(options.removal_list)
    ids, id_field = read_removal_source(url)
    check_id_field(id_field, f"--removal-list {url}", options.id_field)
    listed = log_url_of(url) if is_tree_source(url) else url
    fs, path = storage.filesystem(listed)
    digest = hashlib.sha256()
    with storage.reaching(listed):
        # A tree's unfinished removal (shards.removal.lists.pending_removal) may come before its first log.
        logged = listed == url or fs.exists(path)
        if logged:
            with fs.open(path, "rb") as f:  # its bytes streamed, never held whole
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
    if listed != url and len(ids) > (len(set(log_ids(listed))) if logged else 0):
        digest.update("".join(f"{i}\n" for i in ids).encode())  # the ids its journal adds to the log
    return {"source": url, "sha256": digest.hexdigest(), "ids": len(ids)}


def learn_and_publish(options: TrainBpeSettings, run_id: str, argv: list[str],
                      removal: dict | None = None) -> tuple[files.TrainingStats, tuple[float, float]]:
    """Steps 3 and 4: learn the merges from the run's count shards, then publish the files.
    Returns the stats and the wall and CPU seconds the merges took."""
    from transforms.bpe.count import read_count_shards

    output = storage.normalize(options.output)
    counting = options.count_config(run_url(output, run_id))
    numbers, drops = _run_numbers(output, counting.run_url)
    read, kept = numbers.get("documents_read", 0), numbers.get("documents", 0)
    words = read_count_shards(counting)
    chars = pretokenize.alphabet_of((w for w, _ in words), options.alphabet)
    ids = None if chars is None else {c: i for i, c in enumerate(chars)}
    base = 256 if chars is None else len(chars)
    try:
        n_merges = options.merges_for(base)
    except ValueError as e:
        raise UsageError(str(e)) from None
    log.info("learning %d merges over %d words (%d base symbols)", n_merges, len(words), base)
    learned, merge_seconds = _learn(words, ids, base, n_merges)
    if len(learned.merges) < n_merges:
        log.warning("only %d merges: no word has two symbols left", len(learned.merges))
    tokens = files.token_bytes(chars, learned.merges)
    eos_id = len(tokens)
    header = f"beam-pretokenize {tool_version()} train-bpe {shlex.join(argv)}"  # a --keep's spaces quoted
    stats = files.TrainingStats(
        header=header,
        documents_read=read,
        documents_kept=kept,
        drops=drops,
        characters=numbers.get("characters", 0),
        pre_tokens=numbers.get("pre_tokens", 0),
        distinct_words=numbers.get("distinct_words", 0),
        words_kept=len(words),
        characters_kept=sum(len(w) * n for w, n in words),
        pattern=options.pattern,
        alphabet=options.alphabet,
        base_size=base,
        merges=len(learned.merges),
        eos_token=options.eos_token,
        eos_id=eos_id,
        tokens_before=learned.symbols_before,
        tokens_after=learned.symbols_after,
        first_merges=tuple(files.shown(t) for t in tokens[base:base + files.SHOWN_MERGES]),
        removal_list=removal,
    )
    written = _tokenizer_files(options, tokens, learned.merges, header, argv, removal)
    tree.Tree(output).write(tree.Tree.temp_name(run_id, tree.Tree.PUBLISHING_MARK), b"")  # abandon_run reads it
    publish(output, written, stats.to_text().encode())
    return stats, merge_seconds


def _run_numbers(output: str, run_url_: str) -> tuple[dict, dict[str, int]]:
    """The numbers the count wrote to run_stats.json, and the drops among them by reason; a
    RuntimeError when the documents read are not those counted and dropped."""
    fs, _ = storage.filesystem(output)
    numbers = json.loads(fs.cat_file(storage.filesystem(storage.join(run_url_, RUN_STATS_NAME))[1]))
    drops = {k.split(":", 1)[1]: v for k, v in numbers.items() if k.startswith("dropped:")}
    read, kept = numbers.get("documents_read", 0), numbers.get("documents", 0)
    if read != kept + sum(drops.values()):
        raise RuntimeError(f"documents read ({read}) != counted ({kept}) + dropped ({sum(drops.values())})")
    return numbers, drops


def _learn(words: list, ids: dict | None, base: int, n_merges: int):
    """Step 3: the merges learnt from the counted ``words``, with a bar; and the wall and CPU
    seconds they took."""
    start, start_cpu = time.monotonic(), time.process_time()
    with LauncherBar("merges", n_merges, "merges") as bar:

        def show_merge(k, pair, count):
            bar.set(k + 1)
            if not bar.drawn and (k + 1) % 5000 == 0:
                log.info("merge %d of %d (count %d), %.0f s", k + 1, n_merges, count, time.monotonic() - start)

        learned = learn_merges([pretokenize.word_symbols(w, ids) for w, _ in words], [n for _, n in words], base,
                               n_merges, on_merge=show_merge)
    return learned, (time.monotonic() - start, time.process_time() - start_cpu)


def _tokenizer_files(options: TrainBpeSettings, tokens: list[bytes], merges, header: str, argv: list[str],
                     removal: dict | None) -> dict[str, bytes]:
    """The files a trained tokenizer is, by name, tokenizer_info.json (their sha256) last."""
    regex, eos_id = pretokenize.PATTERNS[options.pattern], len(tokens)
    written = {
        files.TIKTOKEN_NAME: files.tiktoken_text(tokens),
        files.HF_NAME: files.hf_json(tokens, merges, options.pattern, regex, options.eos_token),
        files.MERGES_NAME: files.merges_text(tokens, merges, header),
        files.HF_CONFIG_NAME: files.hf_config_json(options.eos_token, eos_id),
        files.HF_SPECIAL_NAME: files.hf_special_json(options.eos_token),
    }
    info = files.TokenizerInfo(
        pattern=options.pattern, regex=regex, alphabet=options.alphabet, ranks=len(tokens),
        eos_token=options.eos_token, eos_id=eos_id, merges=len(merges), version=tool_version(),
        flags=tuple(argv), sha256={name: files.sha256(data) for name, data in written.items()},
        removal_list=removal,
    )
    written[files.INFO_NAME] = info.to_json().encode()
    return written


def publish(output: str, written: dict[str, bytes], stats_text: bytes) -> None:
    """Step 4: the record first, the commit point out, the files, the commit point in."""
    record = tree.owned(output, KIND)
    tree.record_files(output, record, add=files.FILES)
    tree.delete_listed(output, [files.STATS_NAME])
    for name, data in written.items():
        tree.write_file(output, name, data)
    tree.write_file(output, files.STATS_NAME, stats_text)


def summary_table(stats: files.TrainingStats, output: str, count_seconds: tuple[float, float],
                  merge_seconds: tuple[float, float]) -> str:
    """``count_seconds``: the launch's and the pipeline's; ``merge_seconds``: wall and CPU."""
    per_token = stats.characters_kept / stats.tokens_after if stats.tokens_after else 0.0
    lines = summary.drop_lines(stats.documents_read, stats.documents_kept, stats.drops)
    lines += [
        f"characters {stats.characters:,}, pre-tokens {stats.pre_tokens:,}, distinct words {stats.distinct_words:,}"
        f" ({stats.words_kept:,} kept)",
        f"merges {stats.merges:,} over {stats.base_size} base symbols; vocabulary {stats.eos_id + 1:,} "
        f"(EOS {stats.eos_token} = {stats.eos_id})",
        f"tokens {stats.tokens_before:,} -> {stats.tokens_after:,}: {per_token:.3f} characters a token",
        f"first merges: {' '.join(json.dumps(s, ensure_ascii=False) for s in stats.first_merges[:10])}",
        f"launch {count_seconds[0]:.1f} s, counting {count_seconds[1]:.1f} s, merges {merge_seconds[0]:.1f} s "
        f"({merge_seconds[1]:.1f} CPU s)",
        f"output: {output}",
    ]
    return "\n".join(lines)


@lock.command("train-bpe")
def run(argv: list[str] | None = None, say_summary: bool = True) -> files.TrainingStats | None:
    """Parse, count on Beam, learn and publish, print the summary (``say_summary``); the stats (None:
    --dry_run ran nothing). The files record ``argv`` (pipelines.api.train_bpe: its keywords' twin)."""
    argv = list(argv or [])
    start = time.monotonic()
    run_id = launch.new_run_id()
    with errors.launching():
        options, pipeline_options = parse_args(argv)
        dry_run = run_mode.is_dry_run(pipeline_options)
        removal = removal_record(options)
        pipeline = job.built(build, options, pipeline_options, run_id, run_mode.RunMode(dry_run=dry_run))
    output = storage.normalize(options.output)
    launch_seconds = time.monotonic() - start
    with job.stopping(functools.partial(_stopped, output, run_id), dry_run=dry_run) as interrupted:
        with progress.showing_progress(pipeline_options, run_id, ending=("counting", "counted")):
            result = pipeline.run()
            if dry_run:
                print(run_mode.end_dry_run(output, pipeline_options), flush=True)
                return None
            job.wait_for(result, interrupted)
        if interrupted:  # Ctrl-C that a runner swallowed: stop before learning and publishing
            raise KeyboardInterrupt
        count_seconds = time.monotonic() - start - launch_seconds
        stats, merge_seconds = learn_and_publish(options, run_id, argv, removal)
    launch.abandon_run(output, run_id)
    if say_summary:
        print(summary_table(stats, output, (launch_seconds, count_seconds), merge_seconds), flush=True)
    return stats

