"""The verifier: checks an output tree against its format, and optionally against its source.

    pretokenize verify --output out/ [--input 'data/*.parquet' [--sample 0.1]] [--runner ...]

Exits 0 when the tree is right, 1 with a report of each problem (file, document, what is wrong)
otherwise, and prints a one-line verdict either way.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.common import add_flag, launching, parse_job_args
from shards import layout, llmc, storage
from shards.manifest import DatasetStats
from shards.removal import REMOVALS_NAME, parse_removal_line, read_removal_list
from transforms.verify import MAX_REPORTED, VerifyConfig, VerifyOutput, plan_units, read_checksums, write_report


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(
        prog="pretokenize verify",
        description="Check a bucketed output tree against its format (and its source with --input).",
        epilog="Other flags go to Beam's PipelineOptions (--runner, ...).",
    )
    add_flag(p, "output", required=True, help="the output tree to check (bucketed or scaffold)")
    add_flag(p, "input", default=None, help="the source documents, to re-tokenize and compare")
    add_flag(p, "sample", type=float, default=1.0, help="fraction of ids to compare with the source (default 1)")
    add_flag(p, "removal-list", default=None,
             help="the --removal-list the job ran with: its ids are not expected in the output")
    add_flag(p, "report", default=None, help="where to write the JSON report (default: a temporary "
             "file under the output, removed afterwards)")
    return parse_job_args(p, argv)


def _read_stats(output: str) -> DatasetStats | str:
    fs, root = storage.filesystem(output)
    path = f"{root.rstrip('/')}/{layout.STATS_NAME}"
    if not fs.exists(path):
        return f"{layout.STATS_NAME}: missing: the tree is not finished (a job died or is still publishing)"
    try:
        with fs.open(path, "r", encoding="utf-8") as f:
            return DatasetStats.from_text(f.read())
    except (ValueError, KeyError) as e:
        return f"{layout.STATS_NAME}: unreadable: {e}"


def _is_scaffold_tree(output: str) -> bool:
    fs, root = storage.filesystem(output)
    path = f"{root.rstrip('/')}/{layout.STATS_NAME}"
    return fs.exists(path) and llmc.is_scaffold_stats(fs.cat_file(path).decode("utf-8", "replace"))


def _verify_scaffold(output: str, args) -> int:
    """The llm.c checks, split by split (each split is one token stream, read once in order)."""
    if args.input:
        print("verify: --input is not supported for scaffold trees; checking the format only", flush=True)
    problems = llmc.check_llmc_tree(output)
    for problem in problems[:MAX_REPORTED]:
        print(f"  {problem}")
    if problems:
        print(f"verify: FAILED, {len(problems)} problems in {output} (scaffold llm.c shards)", flush=True)
        return 1
    print(f"verify: OK, {output} (scaffold llm.c shards)", flush=True)
    return 0


def _removed_ids(output: str, removal_list: str | None) -> frozenset[str]:
    ids = set(read_removal_list(storage.normalize(removal_list))) if removal_list else set()
    fs, root = storage.filesystem(output)
    log = f"{root.rstrip('/')}/{REMOVALS_NAME}"
    if fs.exists(log):
        lines = fs.cat_file(log).decode("utf-8").splitlines()[1:]
        ids.update(parse_removal_line(line)[2] for line in lines if line.strip())
    return frozenset(ids)


def run(argv: list[str] | None = None) -> int:
    with launching():
        args, beam_args = parse_args(argv or [])
        if not 0.0 < args.sample <= 1.0:
            raise ValueError(f"--sample must be within (0, 1], got {args.sample}")
        output = storage.normalize(args.output)
        fs, path = storage.filesystem(output)
        if not fs.isdir(path):
            raise FileNotFoundError(f"--output {output} is not a directory")
    if _is_scaffold_tree(output):
        return _verify_scaffold(output, args)
    stats = _read_stats(output)
    if isinstance(stats, str):
        print(f"  {stats}\nverify: FAILED, 1 problem in {output}", flush=True)
        return 1
    with launching():
        checksums, checksum_problems = read_checksums(output)
        config = VerifyConfig(output, stats.dtype, stats.eos_id, stats.vocab_size, stats.partitions, args.sample,
                              checksums)
        units, launch_problems, rows = plan_units(output)
        launch_problems += checksum_problems
        if checksums is not None:
            launch_problems += [f"{layout.CHECKSUMS_NAME} names {rel}, which is not in the tree"
                                for rel in sorted(set(checksums) - {u.rel_path for u in units})]
        report_url = storage.normalize(args.report) if args.report else storage.join(
            output, layout.TEMP_DIR_NAME, f"verify-{uuid.uuid4().hex[:8]}", "report.json")
        source = storage.normalize(args.input) if args.input else None
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
        report = pipeline | "VerifyOutput" >> VerifyOutput(
            config, units, launch_problems, stats, source, _removed_ids(output, args.removal_list))
        report | "WriteReport" >> beam.Map(write_report, report_url)
    pipeline.run().wait_until_finish()
    fs, path = storage.filesystem(report_url)
    with fs.open(path, "r", encoding="utf-8") as f:
        result = json.load(f)
    if not args.report:
        fs.rm(path.rsplit("/", 1)[0], recursive=True)
        temp_root = storage.filesystem(storage.join(output, layout.TEMP_DIR_NAME))[1]
        if fs.isdir(temp_root) and not fs.ls(temp_root):
            fs.rmdir(temp_root)
    for problem in result["sample"]:
        print(f"  {problem}")
    if result["problems"] > MAX_REPORTED:
        print(f"  ... and {result['problems'] - MAX_REPORTED} more")
    compared = f", source compared on {'all' if args.sample >= 1 else f'{args.sample:.0%} of'} ids" if source else ""
    what = f"{result['files']} files, {result['documents']:,} documents, {result['tokens']:,} tokens{compared}"
    if result["problems"]:
        print(f"verify: FAILED, {result['problems']} problems in {output} ({what})", flush=True)
        return 1
    print(f"verify: OK, {output} ({what})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
