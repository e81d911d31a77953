"""verify's Beam job (launch checks, then steps), apart from its flags, its run loop and its verdict in
pipelines/verify.py so that --help and a flag's error import no Beam: verify.check imports this
module when it checks a tree."""

from __future__ import annotations

import dataclasses
import tempfile
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.beam_flags import view
from pipelines.run_mode import is_dry_run, workers_here
from shards import layout, lock, storage
from shards.removal.lists import (
    DEFAULT_ID_FIELD,
    REMOVALS_NAME,
    iter_log_lines,
    open_log,
    read_removal_list,
    shortened_log_problem,
)
from shards.tree import Tree, inside
from transforms.bucketed.filter import token_conditions
from transforms.core.records import UsageError
from transforms.tools.verify import (
    MAX_REPORTED,
    VerifyConfig,
    VerifyOutput,
    checksum_table,
    files_holding_ids,
    index_problems,
    job_settings,
    plan_units,
    write_report,
)

# MAX_REPORTED too: the problems verify lists, which verify.check also caps its in-process checks at.
__all__ = ["MAX_REPORTED", "Launched", "build"]


@dataclasses.dataclass(frozen=True)
class Launched:
    """What build checked and built: the job, not run yet."""

    pipeline: beam.Pipeline
    units: list  # the files the job checks, one unit of work each
    dry_run: bool  # Beam's --dry_run: the job is translated, never run
    report_url: str  # where the job writes its report
    scratch: str | None  # the directory to remove afterwards (None: the report is kept)


def build(pipeline_options: PipelineOptions, args, output: str, stats) -> Launched:
    """The Beam job that checks the tree ``output`` (its ``stats`` read) with verify's settings ``args``:
    what the launcher can check is checked first, and its problems go into the job's report."""
    config, units, launch_problems, removed = _plan_checks(output, stats, args)
    launch_problems += _left_match_problems(output)
    source = storage.normalize(args.input) if args.input else None
    dry_run = is_dry_run(pipeline_options)  # a local runner refuses it, as the jobs do
    report_url, scratch = _report_place(args.report, pipeline_options, output)
    pipeline = beam.Pipeline(options=pipeline_options)
    verify = VerifyOutput(config, units, launch_problems, stats, source, frozenset(removed))
    if verify.retokenizer:
        _say_retokenizer(verify.retokenizer, stats)
    (
        pipeline
        | "VerifyOutput" >> verify
        | "WriteReport" >> beam.Map(write_report, report_url)
    )
    return Launched(pipeline, units, dry_run, report_url, scratch)


def _removed_ids(output: str, removal_list: str | None, id_field: str) -> tuple[dict[str, str], list[str]]:
    """Ids that must not be stored, each with the list that says so: the tree's removals.txt (the
    audit log of `remove`) and the --removal-list the job ran with; and the audit log's problem
    when it cannot be read, or lists ids of another field than the tree's (a list that cannot be
    read stops the launch)."""
    removed: dict[str, str] = {}
    if removal_list:
        url = storage.normalize(removal_list)
        removed.update(dict.fromkeys(read_removal_list(url), f"the --removal-list {url}"))
    log_url = storage.join(output, REMOVALS_NAME)
    fs, path = storage.filesystem(log_url)
    if fs.exists(path):
        try:
            audit_field, entries = open_log(iter_log_lines(log_url), where=log_url)
            logged = dict.fromkeys((doc_id for _, doc_id in entries), REMOVALS_NAME)  # streamed: no lines held
        except ValueError as e:
            return removed, [f"{REMOVALS_NAME}: unreadable: {e}"]
        removed.update(logged)
        if audit_field is not None and audit_field != id_field:
            return removed, [f"{REMOVALS_NAME}: lists values of the input field {audit_field!r}, but the tree's ids "
                             f"are values of {id_field!r}: removed documents may be stored under other ids"]
    return removed, []


def _report_place(report: str | None, options: PipelineOptions, output: str) -> tuple[str, str | None]:
    """Where the job writes its report, and the directory to remove afterwards (None: keep it).
    Never under the tree being checked (``output``): verify writes nothing there."""
    url, scratch = _report_url(report, options)
    for flag, place in (("--report", report and url), ("--temp_location", scratch)):
        if place and inside(place, output):
            raise UsageError(f"{flag} {place} is inside the tree being checked ({output}), where verify writes "
                             "nothing; give a place outside it")
    return url, scratch


def _report_url(report: str | None, options: PipelineOptions) -> tuple[str, str | None]:
    if report:
        return storage.normalize(report), None
    name = f"pretokenize-verify-{uuid.uuid4().hex[:12]}"
    temp_location = view(options, "GoogleCloudOptions").temp_location
    if temp_location:
        scratch = storage.join(storage.normalize(temp_location), name)
        return storage.join(scratch, "report.json"), scratch
    if not workers_here(options):  # they could not write this machine's temporary directory
        runner = view(options, "StandardOptions").runner
        raise UsageError(
            f"--runner {runner}: its workers cannot write this machine's temporary directory; pass "
            "--temp_location (a URL they and this launcher both reach, e.g. s3://bucket/tmp) or --report"
        )
    scratch = storage.join(tempfile.gettempdir(), name)  # created by the job when it writes the report
    return storage.join(scratch, "report.json"), scratch


def _say_retokenizer(retokenizer: str, stats) -> None:
    ids = stats.special_tokens == "tokenizer"
    mode = ", added tokens as their ids (special_tokens: tokenizer)" if ids else ""
    print(f"  re-encoding the input with {retokenizer} (the tree says "
          f"{stats.tokenizer_backend or 'nothing: written by tiktoken'}){mode}", flush=True)


def _left_match_problems(output: str) -> list[str]:
    """A line when a killed ``remove`` left its id match's files (the ids it was given, encoded)
    and no live writer holds the tree: that they are there, never what they hold."""
    out = Tree(output)
    found = lock.holder(output)
    writing = found is not None and lock.why_free(found, break_lock=False) is None
    count = 0 if writing else out.match_files()
    if not count:
        return []
    name = out.temp_name(out.JOURNAL_DIR, out.MATCH_DIR)
    return [f"{name}: {count} files a killed remove left while matching its list (they hold the listed ids, "
            "encoded); the next command that writes this tree deletes them"]


def _plan_checks(output: str, stats, args):
    """What the launcher checks before the pipeline runs: the config, the files to check, the
    problems found already (checksums, removal log, index), and the removed ids."""
    checksums, checksum_problems = checksum_table(output)
    config = VerifyConfig(output, stats.dtype, stats.eos_id, stats.vocab_size, stats.partitions, args.sample,
                          checksums, eos_inside=stats.special_tokens == "tokenizer",
                          length_conditions=tuple(token_conditions(job_settings(stats).conditions())))
    removed, removal_problems = _removed_ids(output, args.removal_list,
                                             stats.field_settings.get("id_field", DEFAULT_ID_FIELD))
    if not removal_problems:
        logged = sum(1 for where in removed.values() if where == REMOVALS_NAME)
        log_url = storage.join(output, REMOVALS_NAME)
        fs, path = storage.filesystem(log_url)
        problem = shortened_log_problem(REMOVALS_NAME, logged if fs.exists(path) else None, stats.removal_list_ids)
        removal_problems += [problem] if problem else []
    units, launch_problems, rows = plan_units(output, removed)
    launch_problems += files_holding_ids(output, removed, {u.rel_path for u in units})
    launch_problems += checksum_problems + removal_problems + index_problems(output)
    if checksums is not None:
        launch_problems += [f"{layout.CHECKSUMS_NAME} names {rel}, which is not in the tree"
                            for rel in sorted(set(checksums) - {u.rel_path for u in units})]
    return config, units, launch_problems, removed
