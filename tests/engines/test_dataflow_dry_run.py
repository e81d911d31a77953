"""Each job translated for Dataflow with --dry_run: the job graph Dataflow would get, without submitting.

A fake project, region and gs:// temp location; no credentials and no network (the test refuses any
connection that leaves the machine). The input and output are local: the jobs plan their input and
clear the output's interrupted runs while the pipeline is built, so a gs:// path there would call
GCS from the launcher, as it must when a job really launches.
"""

from __future__ import annotations

import importlib
import ipaddress
import socket
import sys
import tarfile

import pytest
from conftest import REPO, SAMPLE_PARQUET
from engine_setup import BEAM_VERSION, required_engines

from pipelines import bucketed

DATAFLOW_FLAGS = [
    "--runner=DataflowRunner",
    "--dry_run=True",
    "--project=example-project",
    "--region=us-central1",
    "--temp_location=gs://example-bucket/tmp",
    f"--setup_file={REPO / 'setup.py'}",
    "--no_save_main_session",
    "--machine_type=n2-standard-4",
    "--max_num_workers=8",
]


@pytest.fixture(autouse=True)
def gcp_extra():
    try:
        importlib.import_module("apache_beam.runners.dataflow.internal.apiclient")
    except ImportError as e:
        message = f"the gcp extra is not installed (make venv-cloud): {e}"
        if "dataflow" in required_engines():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Fail on any connection to an address off this machine (a name lookup alone is not one)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                local = ipaddress.ip_address(host).is_loopback
            except ValueError:
                local = host == "localhost"
            if not local:
                raise AssertionError(f"the dry run tried to connect to {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def bucketed_job(tmp_path, request):
    flags = ["--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out")]
    ours, beam_options = bucketed.parse_args([*flags, *DATAFLOW_FLAGS, "--job_name=pretokenize-bucketed"])
    # TokenizeInputUnits: each input unit read, filtered, tokenized and spilled, then marked done (resume)
    stages = {"TokenizeInputUnits", "CountDocuments", "WriteShards", "PublishOutput"}
    return bucketed.build, ours, beam_options, "pretokenize-bucketed", stages


def scaffold_job(tmp_path, request):
    try:
        scaffold = importlib.import_module("pipelines.scaffold")
    except ImportError as e:
        pytest.skip(f"the scaffold job (pipelines/scaffold.py) is not importable: {e}")
    gpt2 = request.getfixturevalue("gpt2_spec")
    flags = ["--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"), "--annotate", "--tokenizer", gpt2]
    ours, beam_options = scaffold.parse_args([*flags, *DATAFLOW_FLAGS, "--job_name=pretokenize-scaffold"])
    # EncodeInputUnits: each input unit read, encoded and spilled, then marked done (resume)
    stages = {"EncodeInputUnits", "CountDocuments", "WriteLlmcShards", "PublishLlmcOutput"}
    return scaffold.build, ours, beam_options, "pretokenize-scaffold", stages


def staged_files(proto_pipeline) -> dict[str, str]:
    """What the workers' environment stages: {name on the workers: local file}."""
    from apache_beam.portability.api import beam_runner_api_pb2

    (env,) = proto_pipeline.components.environments.values()
    files = {}
    for artifact in env.dependencies:
        role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
        source = beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload)
        files[role.staged_name] = source.path
    return files


@pytest.mark.parametrize("make_job", [bucketed_job, scaffold_job], ids=["bucketed", "scaffold"])
def test_the_job_translates_for_dataflow(make_job, tmp_path, request):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions
    from apache_beam.portability.api import beam_runner_api_pb2

    build, ours, beam_options, job_name, stages = make_job(tmp_path, request)
    pipeline = beam.Pipeline(options=beam_options)
    build(pipeline, ours)
    job = pipeline.run().job  # --dry_run: the Job is made, nothing is staged or submitted

    assert job.options.view_as(GoogleCloudOptions).project == "example-project"
    assert job.proto.name == job_name

    # Our step labels, as Dataflow's UI and job updates will match them: the job's steps and the
    # steps inside them (deeper ones are Beam's own) all named by us, none by Beam's defaults.
    labels = {t.unique_name for t in job.proto_pipeline.components.transforms.values()}
    top_level = {label for label in labels if "/" not in label}
    assert stages <= top_level, f"missing steps: {stages - top_level}"
    ours_or_direct = [label.rsplit("/", 1)[-1] for label in labels if label.count("/") <= 1]
    unlabelled = [label for label in ours_or_direct if label.startswith(("ParDo(", "Map(", "FlatMap(", "Filter("))]
    assert not unlabelled, f"steps without a label of ours: {unlabelled}"

    # One Docker environment: Beam's SDK image for this Python and the pinned Beam version.
    (env,) = job.proto_pipeline.components.environments.values()
    assert env.urn == "beam:env:docker:v1"
    image = beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert image.endswith(f"/beam_python{python}_sdk:{BEAM_VERSION}"), image

    # The workers get our code as the sdist --setup_file built, and no pickled main session.
    assert job.options.view_as(SetupOptions).setup_file == str(REPO / "setup.py")
    files = staged_files(job.proto_pipeline)
    assert "workflow.tar.gz" in files and "pickled_main_session" not in files, sorted(files)
    with tarfile.open(files["workflow.tar.gz"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for module in ("pipelines/bucketed.py", "pipelines/cli.py", "transforms/bucketed/write.py", "shards/layout.py"):
        assert module in names, f"{module} is not in the sdist the workers install"


def test_the_cli_ends_a_dataflow_dry_run_after_translating(tmp_path, capsys):
    """`pretokenize bucketed ... --runner=DataflowRunner --dry_run=True` exits 0 once the job is
    translated: no stats to read back, no shards written, the run's temporary directory gone."""
    from pipelines import cli

    out = tmp_path / "out"
    argv = ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *DATAFLOW_FLAGS]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "dry run: the job was translated for DataflowRunner and not submitted" in printed, printed
    assert not out.exists(), sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))


def _files(root):
    """Every path under ``root``, directories included, with a file's bytes (None for a directory)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def _earlier_run_leftovers(out, kind):
    """An output as earlier runs left it: claimed, an interrupted run's directory, saved work."""
    from shards import tree

    tree.claim(str(out), kind)
    run = out / ".pretokenize-tmp" / "run-20261130-000000-abcdef"
    run.mkdir(parents=True)
    (run / "spill-00000.bin").write_bytes(b"\0" * 64)
    saved = out / ".pretokenize-tmp" / "work-0123456789abcdef0123"
    (saved / "units").mkdir(parents=True)
    (saved / "work.json").write_text("{}")
    (saved / "units" / "000000.done").write_bytes(b"marker")


@pytest.mark.parametrize("job", ["bucketed", "train-bpe"])
def test_a_dry_run_changes_nothing_in_an_existing_output(job, tmp_path, capsys):
    """A dry run into an output an earlier run left (an interrupted run's directory, saved work of
    other settings) checks it and leaves every file as it was: a real run would remove both, and
    a dry run may be aimed at an output a real run is writing."""
    from pipelines import cli

    out = tmp_path / "out"
    _earlier_run_leftovers(out, "bucketed" if job == "bucketed" else "tokenizer")
    before = _files(out)
    size = ["--merges", "10"] if job == "train-bpe" else []
    assert cli.main([job, "--input", str(SAMPLE_PARQUET), "--output", str(out), *size, *DATAFLOW_FLAGS]) == 0
    assert "dry run: the job was translated for DataflowRunner and not submitted" in capsys.readouterr().out
    assert _files(out) == before


@pytest.mark.parametrize("job", ["bucketed", "train-bpe"])
def test_a_dry_run_takes_no_lock(job, tmp_path, capsys):
    """A dry run over an output another command is writing (it holds the lock) is translated all
    the same: it takes no lock, and leaves the holder's lock and every file as they were."""
    from pipelines import cli
    from shards import lock

    out = tmp_path / "out"
    _earlier_run_leftovers(out, "bucketed" if job == "bucketed" else "tokenizer")
    size = ["--merges", "10"] if job == "train-bpe" else []
    with lock.scope(f"pretokenize {job} --output {out}"):
        lock.take(str(out))
        before = _files(out)
        assert cli.main([job, "--input", str(SAMPLE_PARQUET), "--output", str(out), *size, *DATAFLOW_FLAGS]) == 0
        assert "dry run: the job was translated for DataflowRunner and not submitted" in capsys.readouterr().out
        assert _files(out) == before
    assert lock.holder(str(out)) is None


def test_train_bpe_ends_a_dataflow_dry_run_after_translating(tmp_path, capsys):
    """train-bpe with --dry_run translates the counting for Dataflow and stops there: no merges are
    learnt from counts that were never made, and nothing is written."""
    from pipelines import cli

    out = tmp_path / "tok"
    argv = ["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--vocab-size", "300", *DATAFLOW_FLAGS]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.strip().splitlines()[-1].startswith("dry run: the job was translated for DataflowRunner"), printed
    assert not out.exists()


@pytest.mark.parametrize("job", ["bucketed", "train-bpe"])
def test_a_dry_run_whose_translation_fails_removes_nothing(job, tmp_path, monkeypatch):
    """The translation raises: the error goes out as it is, and the output's files stay (a failed
    real run would clear its leftovers and saved work without finished units)."""
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    from pipelines import cli

    def fail(self, pipeline, options):
        raise RuntimeError("translation failed")

    monkeypatch.setattr(DataflowRunner, "run_pipeline", fail)
    out = tmp_path / "out"
    _earlier_run_leftovers(out, "bucketed" if job == "bucketed" else "tokenizer")
    before = _files(out)
    size = ["--merges", "10"] if job == "train-bpe" else []
    with pytest.raises(RuntimeError, match="translation failed"):
        cli.main([job, "--input", str(SAMPLE_PARQUET), "--output", str(out), *size, *DATAFLOW_FLAGS])
    assert _files(out) == before


def test_a_template_launchers_dry_run_changes_nothing(tmp_path, capsys):
    """A Flex Template's launcher (``wait=False``) under --dry_run leaves an existing output as it was."""
    from pipelines import cli

    out = tmp_path / "out"
    _earlier_run_leftovers(out, "bucketed")
    before = _files(out)
    args = ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *DATAFLOW_FLAGS]
    assert cli.main(args, wait=False) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "--dry_run: the job was translated, not submitted"
    assert _files(out) == before


def test_a_dry_run_over_a_pending_removal_writes_nothing_and_keeps_the_journal(tmp_path, capsys):
    """An output with an interrupted removal (its journal): the dry run still builds the job that
    keeps those documents out, and the output, journal included, is left as it was."""
    from pipelines import cli, remove
    from shards import layout, manifest
    from shards.removal.journal import load_journal

    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"]) == 0
    flagged = tmp_path / "flagged.txt"
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        first_id = next(manifest.read_rows(f))[1]
    flagged.write_text(first_id + "\n")
    remove.prepare(remove.RemoveSettings(str(out), str(flagged)))  # what remove does before it dies
    assert load_journal(str(out)) is not None
    before = _files(out)
    capsys.readouterr()
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *DATAFLOW_FLAGS]) == 0
    assert "dry run: the job was translated" in capsys.readouterr().out
    assert _files(out) == before


def _tree_with_a_flagged_id(tmp_path):
    from pipelines import cli
    from shards import layout, manifest

    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"]) == 0
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        first_id = next(manifest.read_rows(f))[1]
    flagged = tmp_path / "flagged.txt"
    flagged.write_text(first_id + "\n")
    return out, flagged


def test_a_dry_run_of_remove_translates_and_writes_nothing(tmp_path, capsys):
    """Issue 23, defect 5: `remove --runner=DataflowRunner --dry_run=True` wrote the journal and deleted
    dataset_stats.txt, then failed, leaving a removal that the next run carried out."""
    from pipelines import cli

    out, flagged = _tree_with_a_flagged_id(tmp_path)
    before = _files(out)
    capsys.readouterr()
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(flagged), *DATAFLOW_FLAGS]) == 0
    assert "dry run: the job was translated for DataflowRunner" in capsys.readouterr().out
    assert _files(out) == before


def test_a_dry_run_of_verify_translates_and_writes_nothing(tmp_path, capsys):
    from pipelines import cli

    out, _ = _tree_with_a_flagged_id(tmp_path)
    before = _files(out)
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), *DATAFLOW_FLAGS]) == 0
    assert "dry run: the job was translated for DataflowRunner" in capsys.readouterr().out
    assert _files(out) == before


@pytest.mark.parametrize("job", ["remove", "verify"])
def test_a_local_runner_refuses_a_dry_run_of_remove_and_verify(job, tmp_path, capsys):
    from pipelines import cli

    out, flagged = _tree_with_a_flagged_id(tmp_path)
    before = _files(out)
    capsys.readouterr()
    extra = ["--removal-list", str(flagged)] if job == "remove" else []
    assert cli.main([job, "--output", str(out), *extra, "--runner=FnApiRunner", "--dry_run=True"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dry_run is for a remote runner" in err[0]
    assert _files(out) == before
