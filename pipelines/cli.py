"""The ``pretokenize`` console script: one subcommand per job.

Bad input ends the run with exit status 2 and one line naming the file and the problem, instead
of a runner's traceback; any other failure keeps its traceback and exits 1.
"""

from __future__ import annotations

import logging
import sys

from transforms.core.process_exit import freeze_at_exit

# Before Beam is imported, so it runs after Beam's own exit hooks (transforms/core/process_exit.py).
freeze_at_exit()

# Importing Beam without its GCP extra logs a warning about BigQuery clients that a user of this
# tool cannot act on; drop that one message (the filter must be in place before the import).
logging.getLogger().addFilter(lambda record: "apitools not found" not in record.getMessage())

from pipelines import jobs, progress_prior  # noqa: E402
from pipelines.jobs import JOBS, PLAIN_TOOLS, PUBLISHING, SUBMITTABLE  # noqa: E402


def _usage() -> str:
    lines = ["usage: pretokenize JOB [flags]   (pretokenize JOB --help for a job's flags; pretokenize --version)", "",
             "jobs:"]
    lines += [f"  {name:<10} {job.help}" for name, job in JOBS.items()]
    return "\n".join(lines)


def _unknown_job(job: str) -> str:
    import difflib

    close = difflib.get_close_matches(job, JOBS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"pretokenize: unknown job {job!r}{hint}\n\n{_usage()}"


class StderrHandler(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is when the record is logged, not as it was when
    logging was set up. main() may run inside a host that swaps stderr and closes the one it
    swapped in (pytest's capture does): a handler bound to that stream would print a
    '--- Logging error ---' traceback for every later record, such as the warning Beam logs as it
    stops a runner's service at interpreter exit."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass  # StreamHandler.__init__ sets it; the current stderr is always the one written to


def _set_up_logging() -> None:
    """A job's log: its progress lines, and one line for an error, never buried in a runner's."""
    # Beam's own INFO chatter would bury the job's progress lines: only ours log at INFO.
    logging.basicConfig(level=logging.WARNING, handlers=[StderrHandler()], force=True)
    for ours in ("pretokenize", "transforms", "pipelines"):
        logging.getLogger(ours).setLevel(logging.INFO)
    from transforms.core.progress import show_worker_logs

    show_worker_logs()
    # A worker's error reaches us as an exception; Beam would also log it with its traceback
    # first, which buries the one line that says what is wrong.
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    # gcsfs logs a failed request's traceback before raising it; the error is said below, in one line.
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None, wait: bool = True) -> int:
    """Runs one job; ``wait``: False for a job that returns once the runner has it (bucketed and
    scaffold, from a Flex Template's launcher: deploy/dataflow/main.py)."""
    progress_prior.command_started()  # a run's launch is timed from here: a sign of the machine's speed
    try:
        return _main(sys.argv[1:] if argv is None else argv, wait)
    finally:
        progress_prior.command_ended()


def _main(argv: list[str], wait: bool) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version" or (argv[0] in JOBS and "--version" in argv[1:]):
        from shards.version import tool_version

        print(f"pretokenize (beam-pretokenize) {tool_version()}")
        return 0
    job, rest = argv[0], argv[1:]
    if job not in JOBS:
        print(_unknown_job(job), file=sys.stderr)
        return 2
    if not wait and job not in SUBMITTABLE:
        print(f"pretokenize {job}: only {' and '.join(SUBMITTABLE)} can be submitted without waiting", file=sys.stderr)
        return 2
    _set_up_logging()
    # Imported here, not above: `pretokenize --help` and a job's --help import no Beam (nor numpy).
    from pipelines.errors import launching
    from shards.lock import unfreed_note

    module = jobs.load(job)
    published = "; nothing was published" if job in PUBLISHING else ""
    try:
        if job in PLAIN_TOOLS:
            with launching():
                result = module.run(rest)
        else:
            result = module.run(rest, **({} if wait else {"wait": False}))
    except KeyboardInterrupt as e:
        print(f"pretokenize {job}: interrupted{published}{unfreed_note(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - reported below, never swallowed
        from pipelines.api import job_error  # the Python API's errors, each the line said here

        error = job_error(job, e)
        if error is None:
            raise
        print(f"pretokenize {job}: {error}{unfreed_note(e)}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0

if __name__ == "__main__":
    sys.exit(main())
