"""The Flex Template's entry point: runs one job with the template's parameters as its flags.

Dataflow's launcher calls ``python main.py --input=... --output=... --job_name=... ...``, one
``--name=value`` per parameter given (metadata.json declares them), plus the pipeline options of
the launch. ``--job=scaffold`` picks the scaffold job; the default is the bucketed job.

What differs from the ``pretokenize`` command:

- it does not wait for the job: it returns once Dataflow has the job, or its job file
  (``wait=False``). The launcher is a short-lived program; Google's Flex Template guide says
  not to wait in it (deploy/README.md);
- a template passes a boolean parameter as ``--annotate=true`` or ``--annotate=false``, which the
  job's own on/off flags are given as ``--annotate`` or left out;
- a template parameter is given once, so a repeatable flag (``--keep``) takes one value or a JSON
  list of them (``["is_truncated == false", "full_doc_lid_score >= 0.8"]``), given to the job as
  one flag each; a condition never starts with ``[``;
- the runner is Dataflow unless a ``--runner`` is given (Beam's default would run the whole job
  inside the launcher);
- the workers install ``requirements.txt`` beside this file (gcsfs, for gs://) unless a
  ``--requirements_file`` is given: the launcher passes ``--setup_file``, whose sdist brings the
  package's base dependencies only (launch.sh direct passes the same file).
"""

from __future__ import annotations

import json
import os
import sys

from pipelines import cli, jobs
from transforms.core.records import UsageError

TEMPLATE_JOBS = jobs.SUBMITTABLE  # a template's launcher must not wait for its job
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")
# What the workers install besides the package; they fetch it from PyPI as they fetch the
# package's own dependencies, so the launcher downloads nothing to stage (--requirements_cache=skip).
WORKER_REQUIREMENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")


def job_argv(argv: list[str]) -> list[str]:
    """``pretokenize``'s arguments for the template's: the job first, its flags after. A UsageError
    for a job the template does not run or a boolean parameter that is neither true nor false."""
    job, rest = "bucketed", []
    for arg in argv:
        if arg.startswith("--job="):
            job = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if job not in TEMPLATE_JOBS:
        raise UsageError(f"--job={job}: the template runs {' or '.join(TEMPLATE_JOBS)}")
    switches, repeatable = _switches(job), _repeatable(job)
    flags = []
    for arg in rest:
        name, eq, value = arg.partition("=")
        if eq and name.replace("_", "-") in repeatable and value.lstrip().startswith("["):
            flags += [f"{name}={item}" for item in _json_list(arg, value)]
            continue
        if eq and name.replace("_", "-") in switches:
            if value.lower() in _TRUE:
                flags.append(name)
            elif value.lower() not in _FALSE:
                raise UsageError(f"{arg}: a boolean parameter is true or false")
            continue
        flags.append(arg)
    if not _given(flags, "--runner"):
        flags.append("--runner=DataflowRunner")
    if not _given(flags, "--requirements_file"):
        flags += [f"--requirements_file={WORKER_REQUIREMENTS}", "--requirements_cache=skip"]
    return [job, *flags]


def _given(flags: list[str], name: str) -> bool:
    return any(arg == name or arg.startswith(f"{name}=") for arg in flags)


def _switches(job: str) -> set[str]:
    """The job's on/off flags (``--annotate``), spelled with dashes."""
    parser = jobs.load(job).make_parser()
    return {s for a in parser._actions if a.nargs == 0 for s in a.option_strings if s.startswith("--")}


def _repeatable(job: str) -> set[str]:
    """The job's flags that may be given more than once (``--keep``), spelled with dashes."""
    parser = jobs.load(job).make_parser()
    return {s for a in parser._actions if a.__class__.__name__ == "_AppendAction"
            for s in a.option_strings if s.startswith("--")}


def _json_list(arg: str, value: str) -> list[str]:
    """The values of a repeatable flag's parameter given as a JSON list of strings."""
    try:
        items = json.loads(value)
    except ValueError as e:
        raise UsageError(f"{arg}: not a JSON list of strings ({e})") from None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise UsageError(f"{arg}: not a JSON list of strings")
    return items


def main(argv: list[str]) -> int:
    try:
        args = job_argv(argv)
    except UsageError as e:
        print(f"pretokenize template: {e}; nothing was published", file=sys.stderr)
        return 2
    return cli.main(args, wait=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
