"""The Dataflow Flex Template: its entry point (deploy/dataflow/main.py) under --dry_run, its
parameters (metadata.json) against the jobs' real flags, the pins of its images, and launch.sh.

The entry point runs as Dataflow's launcher runs it: ``python main.py --name=value ...``, one flag
per template parameter. No cloud account is needed: DataflowRunner's --dry_run translates the job
and stops before anything is staged or submitted, and no connection may leave the machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, SAMPLE_PARQUET
from engine_setup import BEAM_VERSION
from test_dataflow_dry_run import DATAFLOW_FLAGS, gcp_extra, no_network  # noqa: F401 - fixtures

from pipelines import bucketed, cli, scaffold
from shards import layout
from transforms.core.records import UsageError

DEPLOY = REPO / "deploy" / "dataflow"
METADATA = DEPLOY / "metadata.json"
JOBS = {"bucketed": bucketed, "scaffold": scaffold}
# Job flags that are not template parameters, and why.
NOT_PARAMETERS = {
    "tokenizer_threads": "threads of one worker's tokenizer: for a local run on a large machine; on Dataflow "
    "each vCPU runs its own SDK process",
    "workers": "local worker processes; Dataflow's are its own --num_workers and --max_num_workers",
    "plan": "prints the plan of a run and runs nothing: for a terminal, not a launcher",
    "break_lock": "takes the output's lock from a command that is dead, which someone at a terminal must judge; a "
    "launcher that died leaves a lease that expires by itself (shards/lock.py)",
}
# A value for each parameter without a default to copy from its help text.
EXAMPLE_VALUES = {
    "input": "gs://example-bucket/finepdfs-edu/eng_Latn/*.parquet",
    "output": "gs://example-bucket/out",
    "license": "odc-by",
    "source_dataset": "HuggingFaceFW/finepdfs-edu",
    "tokenizer": "gpt2",
    "eos_token": "<|endoftext|>",
    "removal_list": "gs://example-bucket/removals.txt",
    "text_field": "text",
    "keep": "is_truncated == false",
}


def template_main():
    """deploy/dataflow/main.py, loaded as the launcher runs it (a file, not a package module)."""
    spec = importlib.util.spec_from_file_location("template_main", DEPLOY / "main.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parameters() -> list[dict]:
    return json.loads(METADATA.read_text())["parameters"]


def job_flags(job: str) -> dict[str, object]:
    """The job's own flags as template parameter names (--lid-threshold: lid_threshold) -> action."""
    parser = JOBS[job].make_parser()
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def jobs_of(parameter: dict) -> list[str]:
    return parameter.get("parentTriggerValues") or list(JOBS)


def example_value(parameter: dict) -> str:
    if parameter.get("paramType") == "ENUM":
        return parameter["enumOptions"][-1]["value"]
    if parameter.get("paramType") == "BOOLEAN":
        return "true"
    default = re.search(r"Default: (\S+?)\.?$", parameter["helpText"])
    return EXAMPLE_VALUES.get(parameter["name"]) or default.group(1)


@pytest.fixture
def waits(monkeypatch):
    """Records every wait_until_finish of a Dataflow result, and the translated job."""
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    calls = {"waited": 0, "jobs": []}
    real_run = DataflowRunner.run_pipeline

    def run_pipeline(self, pipeline, options, *args, **kwargs):
        result = real_run(self, pipeline, options, *args, **kwargs)
        calls["jobs"].append(result.job)
        real_wait = result.wait_until_finish

        def wait_until_finish(duration=None):
            calls["waited"] += 1
            return real_wait(duration)

        result.wait_until_finish = wait_until_finish
        return result

    monkeypatch.setattr(DataflowRunner, "run_pipeline", run_pipeline)
    return calls


TEMPLATE_CASES = {
    "bucketed": ["--lid_threshold=0.9", "--max_shard_bytes=1.5e9", "--partitions=4", "--on_bad_record=fail"],
    "scaffold": ["--job=scaffold", "--annotate=true", "--long_docs=chunk", "--shard_tokens=1e8",
                 "--val_fraction=0.05"],
}


@pytest.mark.parametrize("job", list(TEMPLATE_CASES))
def test_the_template_launcher_translates_the_job_and_returns_without_waiting(job, tmp_path, waits, capsys,
                                                                               request):
    out = tmp_path / "out"
    argv = [f"--input={SAMPLE_PARQUET}", f"--output={out}", *TEMPLATE_CASES[job],
            f"--job_name=pretokenize-{job}-template", *(f for f in DATAFLOW_FLAGS if f != "--runner=DataflowRunner")]
    if job == "scaffold":
        argv.append(f"--tokenizer={request.getfixturevalue('gpt2_spec')}")

    assert template_main().main(argv) == 0

    # The launcher's runner is Dataflow without being told; the job was translated once, never waited on.
    (translated,) = waits["jobs"]
    assert translated.proto.name == f"pretokenize-{job}-template"
    assert waits["waited"] == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "--dry_run: the job was translated, not submitted"
    # A dry run checks the output and writes nothing into it (a real launch claims it for the job).
    assert not out.exists()


def test_the_command_still_waits_and_prints_the_summary(tmp_path, monkeypatch, capsys):
    from apache_beam.runners.portability.fn_api_runner.fn_runner import RunnerResult

    waited = []
    real_wait = RunnerResult.wait_until_finish
    monkeypatch.setattr(RunnerResult, "wait_until_finish",
                        lambda self, duration=None: waited.append(1) or real_wait(self, duration))
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"]) == 0
    assert waited == [1]
    printed = capsys.readouterr().out
    assert "documents read 190, kept 149" in printed and (out / layout.STATS_NAME).is_file()


def test_the_template_turns_boolean_parameters_into_switches_and_defaults_to_dataflow():
    job_argv = template_main().job_argv
    workers = [f"--requirements_file={DEPLOY / 'requirements.txt'}", "--requirements_cache=skip"]
    assert job_argv(["--job=scaffold", "--annotate=true", "--input=a"]) == [
        "scaffold", "--annotate", "--input=a", "--runner=DataflowRunner", *workers]
    assert job_argv(["--job=scaffold", "--annotate=false", "--input=a", "--runner=DirectRunner",
                     "--requirements_file=mine.txt"]) == [
        "scaffold", "--input=a", "--runner=DirectRunner", "--requirements_file=mine.txt"]
    assert job_argv(["--input=a"])[0] == "bucketed"
    with pytest.raises(UsageError, match="--annotate=maybe: a boolean parameter is true or false"):
        job_argv(["--job=scaffold", "--annotate=maybe"])
    with pytest.raises(UsageError, match="--job=verify: the template runs bucketed or scaffold"):
        job_argv(["--job=verify"])


def test_a_repeatable_flag_takes_one_value_or_a_json_list_of_them():
    """A template's parameter is given once: --keep, repeatable on the command line, takes a JSON list."""
    job_argv = template_main().job_argv
    conditions = ["is_truncated == false", 'dump in ["a", "b"]']
    argv = job_argv(["--input=a", "--keep=" + json.dumps(conditions)])
    assert [arg for arg in argv if arg.startswith("--keep")] == [f"--keep={c}" for c in conditions]
    assert [arg for arg in job_argv(["--input=a", "--keep=x >= 1"]) if arg.startswith("--keep")] == ["--keep=x >= 1"]
    for bad in ("[1, 2]", "[not json", '["a", null]'):
        with pytest.raises(UsageError, match="not a JSON list of strings"):
            job_argv(["--input=a", f"--keep={bad}"])


def test_a_template_parameter_of_the_other_job_is_refused_in_one_line(tmp_path, capsys):
    argv = [f"--input={SAMPLE_PARQUET}", f"--output={tmp_path / 'out'}", "--job=scaffold", "--annotate=true",
            "--lid_threshold=0.9", *DATAFLOW_FLAGS]
    assert template_main().main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pretokenize scaffold: unknown flag or argument: --lid_threshold=0.9")
    assert err.endswith("; nothing was published") and "\n" not in err


# metadata.json


def test_metadata_is_a_flex_template_metadata_message():
    """Parsed strictly by Google's own client types (google-cloud-dataflow-client, in the gcp extra):
    a misspelt or unknown field, or a value of the wrong type, fails here and not at `gcloud dataflow
    flex-template build`."""
    from google.cloud import dataflow_v1beta3

    metadata = dataflow_v1beta3.TemplateMetadata.from_json(METADATA.read_text(), ignore_unknown_fields=False)
    assert metadata.name and metadata.description and not metadata.streaming
    names = [p.name for p in metadata.parameters]
    assert len(names) == len(set(names)), "a parameter is declared twice"
    for p in metadata.parameters:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", p.name), p.name
        assert p.label and p.help_text, f"{p.name}: label and helpText are required"
        for regex in p.regexes:
            re.compile(regex)
        if p.param_type == dataflow_v1beta3.ParameterType.ENUM:
            assert p.enum_options, f"{p.name}: an ENUM parameter lists its options"
        if p.parent_name:
            (parent,) = [q for q in metadata.parameters if q.name == p.parent_name]
            options = {o.value for o in parent.enum_options}
            assert set(p.parent_trigger_values) <= options, f"{p.name}: shown for a job that does not exist"
    required = {p.name for p in metadata.parameters if not p.is_optional}
    assert required == {"input", "output"}


@pytest.mark.parametrize("parameter", parameters(), ids=lambda p: p["name"])
def test_each_parameter_is_a_flag_of_the_jobs_it_is_shown_for(parameter):
    name = parameter["name"]
    if name == "job":  # read by main.py itself
        assert [o["value"] for o in parameter["enumOptions"]] == list(template_main().TEMPLATE_JOBS)
        return
    value = example_value(parameter)
    for regex in parameter.get("regexes", []):
        assert re.fullmatch(regex, value), f"{name}={value} does not match its own regex {regex}"
    for job in JOBS:
        flags = job_flags(job)
        assert (name in flags) == (job in jobs_of(parameter)), (
            f"{name}: a flag of the {job} job is {'not ' if name not in flags else ''}shown for it")
        if name not in flags:
            continue
        action = flags[name]
        if parameter.get("paramType") == "ENUM":
            assert [o["value"] for o in parameter["enumOptions"]] == list(action.choices)
        assert (parameter.get("paramType") == "BOOLEAN") == (action.nargs == 0), f"{name}: BOOLEAN iff a switch"
        default = re.search(r"Default: (\S+?)\.?$", parameter["helpText"])
        if default:
            convert = action.type or (lambda v: {"true": True, "false": False}.get(v, v))
            assert convert(default.group(1)) == action.default, f"{name}: the help text's default is not the job's"
        # The value reaches the job as the launcher passes it: through main.py to the job's parser.
        argv = template_main().job_argv([f"--job={job}", f"--input={EXAMPLE_VALUES['input']}",
                                         f"--output={EXAMPLE_VALUES['output']}", f"--{name}={value}"])
        settings, _ = JOBS[job].parse_args(argv[1:])
        got = getattr(settings, name)
        expected = action.type(value) if action.type else {"true": True}.get(value, value)
        assert got == ((expected,) if action.__class__.__name__ == "_AppendAction" else expected), (name, got)


@pytest.mark.parametrize("job", list(JOBS))
def test_every_flag_of_the_job_is_a_template_parameter(job):
    declared = {p["name"] for p in parameters() if job in jobs_of(p)}
    missing = sorted(set(job_flags(job)) - declared - set(NOT_PARAMETERS))
    assert not missing, (f"flags of the {job} job missing from deploy/dataflow/metadata.json: {missing}; declare "
                         "them there (parentTriggerValues for one job) or list them in NOT_PARAMETERS with why")


# The images and launch.sh


def from_lines(dockerfile) -> list[str]:
    return [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("FROM ")]


def test_the_images_are_pinned():
    (launcher,) = from_lines(DEPLOY / "Dockerfile")
    (worker,) = from_lines(REPO / "deploy" / "worker.Dockerfile")
    python = f"{sys.version_info.major}{sys.version_info.minor}"
    image, _, tag = launcher.rpartition(":")
    assert image == f"gcr.io/dataflow-templates-base/python{python}-template-launcher-base"
    # Spelled as Google's table of Flex Template base images spells its tags: 20250825_RC00.
    assert re.fullmatch(r"\d{8}_RC\d\d", tag), f"the launcher base is not pinned to a release tag: {launcher}"
    assert worker == f"apache/beam_python{sys.version_info.major}.{sys.version_info.minor}_sdk:{BEAM_VERSION}"


@pytest.fixture
def fake_cloud(tmp_path):
    """A `gcloud` and a `pretokenize` on PATH that record their arguments (and gcloud's stdin), for
    launch.sh's logic; `gcloud artifacts repositories describe` succeeds only if REPO_EXISTS=1."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("gcloud", "pretokenize"):
        script = bin_dir / tool
        script.write_text(
            "#!/usr/bin/env bash\n"
            f'echo "{tool} $*" >> "{log}"\n'
            '[[ "$1 $2" == "builds submit" ]] && sed "s/^/  | /" >> ' f'"{log}"\n'
            '[[ "$1 $2 $3" == "artifacts repositories describe" ]] && [[ "${REPO_EXISTS:-0}" != 1 ]] && exit 1\n'
            "exit 0\n")
        script.chmod(0o755)

    def run(*args, **env):
        environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROJECT": "my-project",
                       "BUCKET": "my-bucket", "JOB_NAME": "job-1", **env}
        done = subprocess.run(["bash", str(DEPLOY / "launch.sh"), *args], env=environment, capture_output=True,
                              text=True, check=False)
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return done, calls

    return run


def test_build_template_creates_the_artifact_registry_repository_when_missing(fake_cloud):
    done, calls = fake_cloud("build-template")
    assert done.returncode == 0, done.stderr
    assert calls[0] == ("gcloud artifacts repositories describe pretokenize --project=my-project "
                        "--location=us-central1")
    assert calls[1] == ("gcloud artifacts repositories create pretokenize --project=my-project "
                        "--location=us-central1 --repository-format=docker "
                        "--description=pretokenize Flex Template images")
    image = "us-central1-docker.pkg.dev/my-project/pretokenize/pretokenize-template:latest"
    assert calls[2].startswith("gcloud builds submit") and f"-t, \"{image}\"" in "\n".join(calls[3:6])
    assert calls[-1] == ("gcloud dataflow flex-template build gs://my-bucket/templates/pretokenize.json "
                         f"--project=my-project --image={image} --sdk-language=PYTHON "
                         "--metadata-file=deploy/dataflow/metadata.json")

    done, calls = fake_cloud("build-template", REPO_EXISTS="1")
    assert done.returncode == 0 and not any("repositories create" in c for c in calls)
    assert "creating Artifact Registry repository" not in done.stdout

    done, calls = fake_cloud("build-template", TEMPLATE_IMAGE="gcr.io/my-project/pretokenize-template:1")
    assert not any("artifacts repositories" in c for c in calls), "an image outside Artifact Registry"


def test_run_template_and_direct_launch_either_job(fake_cloud):
    done, calls = fake_cloud("run-template")
    assert done.returncode == 0, done.stderr
    (run,) = calls
    assert ("--parameters=job=bucketed,input=gs://my-bucket/finepdfs-edu/eng_Latn/*.parquet,"
            "output=gs://my-bucket/pretokenized/finepdfs-edu-jet-nemotron,language=eng_Latn,lid_threshold=0.90,"
            "partitions=32,license=odc-by,source_dataset=HuggingFaceFW/finepdfs-edu") in run

    done, calls = fake_cloud("run-template", JOB="scaffold", INPUT="gs://b/in/*.jsonl", OUTPUT="gs://b/out",
                             EXTRA_PARAMETERS="long_docs=chunk")
    (run,) = calls
    assert run.endswith("--parameters=job=scaffold,input=gs://b/in/*.jsonl,output=gs://b/out,long_docs=chunk")

    done, calls = fake_cloud("direct", JOB="scaffold", INPUT="gs://b/in/*.jsonl", OUTPUT="gs://b/out",
                             EXTRA_FLAGS="--long-docs chunk")
    (run,) = calls
    assert run.startswith("pretokenize scaffold --input gs://b/in/*.jsonl --output gs://b/out --long-docs chunk "
                          "--job_name=job-1 --setup_file=./setup.py "
                          "--requirements_file=deploy/dataflow/requirements.txt --requirements_cache=skip "
                          "--no_save_main_session --runner=DataflowRunner")

    done, calls = fake_cloud("direct", JOB="verify")
    assert done.returncode == 2 and calls == [] and "JOB=verify: bucketed or scaffold" in done.stderr
    done, calls = fake_cloud("run-template", JOB="scaffold")  # FinePDFs-Edu is not the scaffold job's input
    assert done.returncode != 0 and calls == [] and "set INPUT to the documents on GCS" in done.stderr


def test_direct_finds_the_readmes_venv_tool_or_says_how_to_get_one(tmp_path):
    """The README's set-up leaves .venv/bin/pretokenize, never activated: launch.sh direct uses it
    when no pretokenize is on PATH, and without either stops with a message, not rc 127."""
    checkout = tmp_path / "checkout"
    (checkout / "deploy" / "dataflow").mkdir(parents=True)
    (checkout / "deploy" / "dataflow" / "launch.sh").write_text((DEPLOY / "launch.sh").read_text())
    log = tmp_path / "calls.log"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PROJECT": "my-project", "BUCKET": "my-bucket",
           "JOB_NAME": "job-1"}

    def direct():
        return subprocess.run(["bash", str(checkout / "deploy" / "dataflow" / "launch.sh"), "direct"], env=env,
                              capture_output=True, text=True, check=False)

    done = direct()
    assert done.returncode == 2, done.stderr
    assert "no pretokenize" in done.stderr and "make venv-cloud" in done.stderr
    tool = checkout / ".venv" / "bin" / "pretokenize"
    tool.parent.mkdir(parents=True)
    tool.write_text(f'#!/usr/bin/env bash\necho "$0 $*" >> "{log}"\n')
    tool.chmod(0o755)
    done = direct()
    assert done.returncode == 0, done.stderr
    (call,) = log.read_text().splitlines()
    assert call.startswith(f"{tool} bucketed --input gs://my-bucket/finepdfs-edu/eng_Latn/*.parquet ")


def test_the_template_parameters_in_launch_sh_are_declared():
    """The parameters run-template passes are in metadata.json (Dataflow refuses undeclared ones)."""
    script = (DEPLOY / "launch.sh").read_text()
    assigned = re.findall(r'^\s*params\+?="(.*)"$', script, flags=re.M)
    passed = {item.split("=", 1)[0] for value in assigned for item in value.split(",") if "=" in item}
    declared = {p["name"] for p in parameters()} | {"sdk_container_image"}
    assert passed and passed <= declared, sorted(passed - declared)



def test_a_launch_that_writes_the_job_to_a_template_location_names_it_and_does_not_wait():
    """A Flex Template's launcher can have the runner write the job (--template_location) for Dataflow
    to start: the result then has no job, and "waiting" on it returns DONE at once, before the job
    has even started (so the command's path would go on to read a dataset_stats.txt nobody has
    written). The launcher's line names the file instead."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult
    from apache_beam.runners.runner import PipelineState

    from pipelines.run_mode import submitted_line

    options = PipelineOptions(["--template_location=gs://b/staging/template_launches/1/job_object"])
    result = DataflowPipelineResult(None, None, options)
    assert result.wait_until_finish() == PipelineState.DONE and not result.has_job
    assert submitted_line(result, "gs://b/out", options) == (
        "wrote the job to gs://b/staging/template_launches/1/job_object for Dataflow to start, not waiting "
        "for it: gs://b/out/dataset_stats.txt appears when it has finished")
    assert submitted_line(result, "gs://b/out", PipelineOptions([])) == (
        "submitted the job, not waiting for it: gs://b/out/dataset_stats.txt appears when it has finished")


def test_main_py_runs_as_the_launcher_runs_it(tmp_path):
    """`python main.py ...` in a process of its own (the launcher runs the file, not a module): exit
    status 0 and the launcher's line, for a dry run; 2 and one line for a job the template does not run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, str(DEPLOY / "main.py"), f"--input={SAMPLE_PARQUET}", f"--output={tmp_path / 'out'}",
            "--job_name=pretokenize-script", *(f for f in DATAFLOW_FLAGS if f != "--runner=DataflowRunner")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "--dry_run: the job was translated, not submitted"
    done = subprocess.run([*argv, "--job=stats"], env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (
        2, "pretokenize template: --job=stats: the template runs bucketed or scaffold; nothing was published\n")
