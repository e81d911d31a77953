"""How a job is run: on which runner, and whether it is run, only translated (Beam's --dry_run),
or only submitted (a Flex Template's launcher, which must not wait for the job).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from typing import TYPE_CHECKING

from pipelines.beam_flags import beam_flag, view
from shards import layout, storage
from transforms.core.records import UsageError

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions


# Runners that run the pipeline in this process or in processes it starts on this machine.
LOCAL_RUNNERS = ("DirectRunner", "FnApiRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "PrismRunner",
                 "TestDirectRunner")


# Every runner Beam knows by its class name alone (its StandardOptions.KNOWN_RUNNER_NAMES, and
# LOCAL_RUNNERS its local ones: tests/pipelines/test_run_mode.py checks both): those runner_class resolves.
KNOWN_RUNNERS = (*LOCAL_RUNNERS, "DataflowRunner", "FlinkRunner", "InteractiveRunner", "KafkaStreamsRunner",
                 "PortableRunner", "SparkRunner", "TestDataflowRunner")


def is_local_runner(runner: str | None) -> bool:
    return runner is None or runner_class(runner) in LOCAL_RUNNERS


def runner_class(runner: str) -> str:
    """The class Beam runs for ``--runner``: a dotted path's last part, or a runner it knows named in
    any case, with or without its "Runner" (``direct``, ``flink``: Beam's runners/runner.py create_runner)."""
    if "." in runner:
        return runner.rsplit(".", 1)[-1]
    lower = runner.lower()
    return next((known for known in KNOWN_RUNNERS if lower in (known.lower(), known.lower()[:-len("runner")])),
                runner)


@dataclasses.dataclass(frozen=True)
class Workers:
    """Where a run's workers run, as its Beam flags say: on ``runner`` (None: Beam's default, a
    local one), and on a local runner, in ``processes`` of their own (the FnApiRunner's
    multi_processing mode), ``count`` of them (Beam's --direct_num_workers)."""

    runner: str | None = None
    processes: bool = False
    count: int = 1

    @property
    def local(self) -> bool:
        return is_local_runner(self.runner)

    @classmethod
    def of_args(cls, args: list[str]) -> Workers:
        """From Beam's flags as given (each the last given, as Beam's parser, which takes no
        abbreviation, reads them), without importing Beam; a value Beam would refuse counts as its
        default here, and is refused when Beam parses the flags."""
        return cls(beam_flag(args, "runner"), beam_flag(args, "direct_running_mode") == "multi_processing",
                   _count(beam_flag(args, "direct_num_workers")))

    @classmethod
    def of_options(cls, pipeline_options: PipelineOptions) -> Workers:
        direct = view(pipeline_options, "DirectOptions")
        return cls(view(pipeline_options, "StandardOptions").runner, direct.direct_running_mode == "multi_processing",
                   direct.direct_num_workers)


def _count(given: str | None) -> int:
    """--direct_num_workers read by int(), as Beam's parser reads it (``1_6`` too); 1 for a value it refuses."""
    try:
        return 1 if given is None else int(given)
    except ValueError:
        return 1


def workers_here(pipeline_options: PipelineOptions) -> bool:
    """Whether the job's workers run on this machine, sharing its disk: on a local runner, or with
    the SDK harness in this very process (``--environment_type=LOOPBACK``, which a Flink or Spark
    runner on this machine gets by default: pipelines/engines.py)."""
    if is_local_runner(view(pipeline_options, "StandardOptions").runner):
        return True
    return str(view(pipeline_options, "PortableOptions").environment_type or "").upper() == "LOOPBACK"


def runner_name(pipeline_options: PipelineOptions) -> str:
    runner = view(pipeline_options, "StandardOptions").runner
    return "the default local runner" if runner is None else str(runner)


def is_dry_run(pipeline_options: PipelineOptions) -> bool:
    """Whether Beam's --dry_run asks to translate the job without running it. A UsageError on a
    local runner, which would ignore it and run the whole job, and for a value Beam would
    misread (it takes any value, --dry_run=False too, as true)."""
    value = view(pipeline_options, "TestOptions").dry_run
    if not value:
        return False
    if str(value).lower() in ("false", "0", "no", "off"):
        raise UsageError(f"--dry_run={value}: Beam takes any value as true; leave the flag out for a real run")
    if is_local_runner(view(pipeline_options, "StandardOptions").runner):
        raise UsageError(f"--dry_run is for a remote runner (--runner=DataflowRunner): {runner_name(pipeline_options)} "
                         "would ignore it and run the whole job; --plan shows what a run would do")
    return True


def end_dry_run(output: str, pipeline_options: PipelineOptions) -> str:
    """The line a dry run ends with, its job translated."""
    return (f"dry run: the job was translated for {runner_name(pipeline_options)} and not submitted; "
            f"nothing was written to {output}")


@dataclasses.dataclass(frozen=True)
class RunMode:
    """How a job is run, given to its build and to prepare_output as an argument.

    ``dry_run``: Beam's --dry_run (is_dry_run): the job is translated for a remote runner, never
    run; launching leaves the output as it is, and what building must write (a pending removal's
    id list) goes to ``scratch``, a local directory that exists only while the job is built
    (building()). ``wait``: False for a Dataflow Flex Template's launcher (deploy/dataflow/main.py),
    which returns as soon as the runner has the job, without waiting for it to finish or printing
    its summary; one that waited would hold the launch open for hours and time out
    (deploy/README.md).
    """

    dry_run: bool = False
    wait: bool = True
    scratch: str | None = None


RUN = RunMode()


@contextlib.contextmanager
def building(mode: RunMode):
    """The job is built inside, with the mode it yields: ``mode`` with, for a dry run, its
    ``scratch`` directory, deleted once the job is built (a dry run's job is translated, never
    run, so nothing reads what was written there afterwards)."""
    if not mode.dry_run:
        yield mode
        return
    with tempfile.TemporaryDirectory(prefix="pretokenize-dry-run-") as scratch:
        yield dataclasses.replace(mode, scratch=scratch)


def submitted_line(result, output: str, pipeline_options: PipelineOptions) -> str:
    """What a launcher that does not wait says: the job, and where to see that it has finished.

    A Flex Template's launcher may have the runner write the job to ``--template_location`` for
    Dataflow to start, instead of submitting it: that result has no job id (and waiting on it would
    fail), so the line names the file instead."""
    if view(pipeline_options, "TestOptions").dry_run:
        return "--dry_run: the job was translated, not submitted"
    finished = f"{storage.join(output, layout.STATS_NAME)} appears when it has finished"
    template = view(pipeline_options, "GoogleCloudOptions").template_location
    if template:
        return f"wrote the job to {template} for Dataflow to start, not waiting for it: {finished}"
    job_id = result.job_id() if getattr(result, "has_job", False) else None
    return f"submitted {f'job {job_id}' if job_id else 'the job'}, not waiting for it: {finished}"
