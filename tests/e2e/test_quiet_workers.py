"""--workers 2 prints what one worker prints, and nothing of Beam's SDK harness (issue 37).

A worker process imports Beam; without its GCP extra that logs a warning through
``logging.warning``, which gives the worker a handler on standard error, and every harness record
after it (``INFO:__main__:Logging handler created.``, ...) and each of this project's lines (a second
time: the launcher shows them once from Beam's logging service) was printed there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, SAMPLE_PARQUET

from pipelines.worker_stderr import ErrorReports, _pass_on, harness_line

CLI = "import sys; from pipelines.cli import main; sys.exit(main())"
HARNESS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):|sdk harness|Logging handler created|control channel|"
                     r"apitools not found")


def run_lines(tmp_path, name: str, *extra: str) -> list[str]:
    """The lines a run of the bucketed job on the sample prints (stdout and stderr, no terminal),
    without their timestamps; progress lines only at the end."""
    env = {**os.environ, "PRETOKENIZE_PROGRESS_SECONDS": "100000"}
    done = subprocess.run([sys.executable, "-c", CLI, "bucketed", "--input", str(SAMPLE_PARQUET), "--output",
                           str(tmp_path / name), "--runner=FnApiRunner", *extra], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True)
    return [re.sub(r"^\d{4}-\d\d-\d\d [\d:,]+ ", "", line) for line in done.stdout.splitlines()]


def passed_on(tmp_path, lines: list[bytes]) -> bytes:
    """What the launcher passes on (``_pass_on``) of ``lines`` a worker wrote to its stderr pipe, the
    last without a newline."""
    read_end, write_end = os.pipe()
    out = tmp_path / "out"
    with open(out, "wb") as f:
        os.write(write_end, b"\n".join(lines))
        os.close(write_end)
        _pass_on(read_end, os.dup(f.fileno()))
    return out.read_bytes()


def fed(lines: list[bytes]) -> bytes:
    """What ErrorReports passes on of ``lines`` fed to it one at a time, each with its newline."""
    reports = ErrorReports()
    return b"".join(kept for line in lines for kept in reports.feed(line + b"\n")) + b"".join(reports.end())


@pytest.mark.smoke
def test_two_workers_print_no_more_lines_than_one_and_none_of_the_harness(tmp_path):
    one = run_lines(tmp_path, "one")
    two = run_lines(tmp_path, "two", "--workers", "2")
    assert [line for line in two if HARNESS.search(line)] == []
    assert len(two) <= len(one), "\n".join(two)
    probe = [line for line in two if "on the probe" in line]
    published = [line for line in two if "published " in line and " files, " in line]
    assert len(probe) == 1 and len(published) == 1, "\n".join(two)


@pytest.mark.unit
def test_only_the_records_below_error_of_the_default_format_are_kept_back(tmp_path):
    lines = [b"INFO:__main__:Logging handler created.", b"WARNING:root:apitools not found",
             b"INFO:apache_beam.runners.worker.sdk_worker:Creating insecure control channel",
             b"ERROR:__main__:Python sdk harness failed:", b"Traceback (most recent call last):",
             b"  a line of it", b"INFO in the middle: not a record", b"no newline at the end"]
    assert [harness_line(line) for line in lines] == [True, True, True, False, False, False, False, False]
    assert passed_on(tmp_path, lines) == b"\n".join(lines[3:])


@pytest.mark.unit
def test_beams_reports_of_a_failed_step_are_kept_back_whole_and_other_reports_passed_on(tmp_path):
    step = [b"ERROR:apache_beam.runners.common:bad input: x", b"Traceback (most recent call last):", b'  File "a"',
            b"Bad: x", b"Traceback (most recent call last):", b'  File "b"', b"Bad: x", b"",
            b"During handling of the above exception, another exception occurred:", b"",
            b"Traceback (most recent call last):", b'  File "c"', b"RuntimeError: Bad: x [while running 'tokenize']",
            b"", b"ERROR:apache_beam.runners.worker.sdk_worker:Error processing instruction 4. Original traceback is",
            b"Traceback (most recent call last):", b'  File "d"', b"RuntimeError: Bad: x [while running 'read']", b"",
            b""]
    other = [b"Traceback (most recent call last):", b'  File "e"', b"ImportError: no module", b""]
    crash = [b"ERROR:__main__:Python sdk harness failed:", b"Traceback (most recent call last):", b"  File \"f\"",
             b"OSError: gone"]
    lines = [b"a line of ours", *step, b"INFO:__main__:Logging handler created.", *other, b"after", *crash]
    assert passed_on(tmp_path, lines) == b"\n".join([b"a line of ours", *other, b"after", *crash])


@pytest.mark.unit
def test_another_workers_message_after_a_failed_steps_report_is_passed_on():
    """The workers share one pipe. A failed step's report is kept back up to a blank line; a line
    another worker wrote after its last line (its exception) was kept back with it, so a crash's
    only message (``Fatal Python error: Segmentation fault``) never reached the terminal."""
    step = [b"ERROR:apache_beam.runners.common:bad input: x [while running 'read']",
            b"Traceback (most recent call last):", b'  File "a"', b"BadInputError: x [while running 'read']"]
    other = [b"Fatal Python error: Segmentation fault", b"", b"Current thread 0x1 (most recent call first):",
             b'  File "tok.py", line 3 in encode']
    interleaved = [b"INFO:__main__:Logging handler created."]
    assert fed([*step, *interleaved, *other]) == b"".join(line + b"\n" for line in other)


@pytest.mark.unit
def test_a_part_of_a_failed_steps_report_without_its_step_is_kept_back_too():
    """Two workers' reports, longer than one atomic write to the pipe, interleave: a part of one may
    end (a blank line, then another worker's traceback) before the line naming its step. Under load in
    CI such a part, the tokenizer changed under a two-worker run, reached the terminal as a traceback."""
    part = [b"Traceback (most recent call last):",
            b'  File "apache_beam/runners/common.py", line 1512, in apache_beam.runners.common.DoFnRunner.process',
            b'  File "/x/transforms/bucketed/tokenize.py", line 108, in setup',
            b"transforms.tokenizers.load.TokenizerChanged: bad input: the tokenizer changed while the job ran", b"",
            b"During handling of the above exception, another exception occurred:", b""]
    other = [b"Traceback (most recent call last):", b'  File "e"', b"ImportError: no module", b""]
    assert fed([*part, *other]) == b"".join(line + b"\n" for line in other)
