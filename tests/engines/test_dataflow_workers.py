"""What a Dataflow worker gets from `deploy/dataflow/launch.sh direct`, installed as the worker
installs it, reading and writing gs:// through it; the Flex Template's workers get the same
requirements file; and launch.sh's card flags and disk size.

The launch's own arguments (launch.sh run with a `pretokenize` that records them) go through the
job's parser, then through the call DataflowRunner makes to build the workers' environment
(``environments.python_sdk_dependencies``: Beam's stager, which builds the sdist of --setup_file
and lists the requirements file). Those files, under the names they are staged as, are installed
into a clean venv in the order and with the pip commands of Beam's worker boot
(sdks/python/container/boot.go and piputil.go): each requirements file in two rounds (the staged
files only, then PyPI), then the extra packages, then ``workflow.tar.gz`` (the sdist, with no
extra). The venv is stricter than a worker: Beam's SDK image comes with Beam and Google's client
libraries installed, the venv with nothing, so pip fetches Beam and the rest from PyPI. pip's cache
is used (the worker passes --no-cache-dir), which changes only how long it takes.

In that venv, the package's own storage code writes, reads (whole and a range) and lists a gs://
path through fsspec and gcsfs, against a stand-in for GCS's JSON API on 127.0.0.1 (fake_gcs.py).

Slow: the venv install takes a few minutes (Beam and its dependencies, from pip's cache once warm).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import fake_gcs
from conftest import REPO
from test_dataflow_dry_run import gcp_extra  # noqa: F401 - fixture

from pipelines import bucketed

DEPLOY = REPO / "deploy" / "dataflow"


def launch_argv(tmp_path: Path, **settings: str) -> list[str]:
    """The arguments `launch.sh direct` gives `pretokenize`, each as it is (not split on spaces)."""
    bin_dir, record = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "pretokenize"
    tool.write_text(f"#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > '{record}'\n")
    tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROJECT": "my-project", "BUCKET": "my-bucket",
           "JOB_NAME": "job-1", **settings}
    done = subprocess.run(["bash", str(DEPLOY / "launch.sh"), "direct"], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    return record.read_bytes().decode().split("\0")[:-1]


def staged_for_workers(argv: list[str], build_dir: Path, staged_dir: Path) -> list[str]:
    """The files DataflowRunner would stage for this launch, copied into ``staged_dir`` under the
    names the workers see; their names. Built as launch.sh's command builds them: from the
    checkout's root, with the job's own parser."""
    from apache_beam.runners.portability.stager import Stager
    from apache_beam.transforms import environments

    job, *flags = argv
    assert job == "bucketed"
    _, beam_options = bucketed.parse_args(flags)
    here = os.getcwd()
    os.chdir(REPO)  # launch.sh runs the tool from the checkout's root: --setup_file=./setup.py
    try:
        artifacts = environments.python_sdk_dependencies(beam_options, str(build_dir))
    finally:
        os.chdir(here)
    staged_dir.mkdir()
    names = []
    for source, name, _ in Stager.extract_staging_tuple_iter(artifacts):
        shutil.copyfile(source, staged_dir / name)
        names.append(name)
    return names


def pip(venv: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, check=False)
    if check:
        assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def install_as_a_worker(venv: Path, staged: Path, names: list[str]) -> None:
    """Beam's worker boot, on ``staged``: requirements files, extra packages, the workflow sdist."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for name in names:
        if name == "requirements.txt" or re.fullmatch(r"[0-9a-f]{64}", name):  # a PIP_REQUIREMENTS_FILE artifact
            requirements = str(staged / name)
            # The first round may fail (the packages are not all staged); the second opens PyPI.
            pip(venv, "install", "-r", requirements, "--no-index", "--no-deps", "--find-links", str(staged),
                check=False)
            pip(venv, "install", "-r", requirements, "--find-links", str(staged))
    if "extra_packages.txt" in names:
        for package in (staged / "extra_packages.txt").read_text().splitlines():
            pip(venv, "install", "--upgrade", "--force-reinstall", "--no-deps", str(staged / package))
            pip(venv, "install", str(staged / package))
    if "workflow.tar.gz" in names:
        pip(venv, "install", str(staged / "workflow.tar.gz"))


# Run by the worker's Python, from outside the checkout: the package and gcsfs as installed there.
WORKER_SCRIPT = """
import sys
from shards import storage

assert sys.prefix == {venv!r} and storage.__file__.startswith({venv!r}), (sys.prefix, storage.__file__)
small, large = bytes(range(256)) * 64, bytes(range(251)) * 50_000  # 16 KiB; 12.5 MB, over gcsfs's block
storage.write_atomic("gs://worker-bucket/out/dataset_stats.txt", small)
fs, path = storage.filesystem("gs://worker-bucket/out/1024/p00_00000.npy")
print(type(fs).__module__, type(fs).__name__)
with fs.open(path, "wb", block_size=5 * 2**20) as f:
    f.write(large)
assert storage.read_bytes(fs, "worker-bucket/out/dataset_stats.txt") == small
with storage.open_read(fs, path) as f:
    f.seek(7_000_000)
    assert f.read(4096) == large[7_000_000:7_004_096]
assert fs.cat_file(path) == large
assert sorted(fs.find("worker-bucket/out")) == ["worker-bucket/out/1024/p00_00000.npy",
                                                  "worker-bucket/out/dataset_stats.txt"], fs.find("worker-bucket")
"""


def test_the_requirements_file_asks_what_the_gcp_extra_asks_of_gcsfs():
    """deploy/dataflow/requirements.txt names gcsfs as pyproject.toml's gcp extra does (one spec, not two)."""
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gcp"]
    wanted = [r for r in extra if re.match(r"gcsfs\b", r)]
    lines = [line.strip() for line in (DEPLOY / "requirements.txt").read_text().splitlines()]
    assert [line for line in lines if line and not line.startswith("#")] == wanted


def test_workers_read_and_write_gs_with_what_launch_sh_stages(tmp_path):
    """Issue 34: without a WORKER_IMAGE the workers installed only the package's base dependencies,
    without gcsfs, and the first gs:// access failed. What launch.sh stages, installed as a worker
    installs it into a clean venv, reads and writes gs:// through gcsfs."""
    argv = launch_argv(tmp_path)
    names = staged_for_workers(argv, tmp_path / "build", tmp_path / "staged")
    assert "workflow.tar.gz" in names, names
    venv = tmp_path / "worker"
    install_as_a_worker(venv, tmp_path / "staged", names)

    with fake_gcs.serve() as (endpoint, store):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "STORAGE_EMULATOR_HOST": endpoint,
               "FSSPEC_GS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
        script = WORKER_SCRIPT.format(venv=str(venv))
        done = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=False)
        objects = dict(store.objects)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0].startswith("gcsfs"), done.stdout
    # The bytes are in the stand-in, as written: the worker wrote to it, not to a local path.
    assert objects[("worker-bucket", "out/dataset_stats.txt")] == bytes(range(256)) * 64
    assert objects[("worker-bucket", "out/1024/p00_00000.npy")] == bytes(range(251)) * 50_000



def test_launch_sh_gives_the_card_finepdfs_edus_licence_and_source(tmp_path):
    """Issue 34: launch.sh passed no --license or --source-dataset, and the card of a gs:// input
    said `license: unknown`. The card launch.sh's run would write names FinePDFs-Edu's licence
    (ODC-By) and the dataset it comes from."""
    from transforms.run.provenance import card_metadata

    argv = launch_argv(tmp_path)
    settings, _ = bucketed.parse_args(argv[1:])
    assert card_metadata(settings, settings.input) == {
        "license": "odc-by", "source_datasets": ["HuggingFaceFW/finepdfs-edu"], "language": ["eng"]}


def test_launch_sh_gives_another_input_no_licence_unless_told(tmp_path):
    """FinePDFs-Edu's licence goes with FinePDFs-Edu: another INPUT gets the card's own default
    (unknown), or what LICENSE and SOURCE_DATASET say, for either job."""
    other = launch_argv(tmp_path, INPUT="gs://b/mine/*.parquet")
    assert "--license" not in other and "--source-dataset" not in other, other
    told = launch_argv(tmp_path, JOB="scaffold", INPUT="gs://b/mine/*.jsonl", OUTPUT="gs://b/out",
                       LICENSE="cc-by-4.0", SOURCE_DATASET="me/mine")
    assert told[0] == "scaffold"
    assert told[told.index("--license") + 1] == "cc-by-4.0" and told[told.index("--source-dataset") + 1] == "me/mine"


def test_launch_sh_uses_the_disk_size_sizing_md_justifies(tmp_path):
    """One disk size: SIZING.md's, in both of launch.sh's launches."""
    sizing_md = (DEPLOY / "SIZING.md").read_text()
    sizing = re.search(r"\*\*Disk: (\d+) GB per worker\*\* \(`--disk_size_gb=(\d+)`", sizing_md)
    assert sizing and sizing[1] == sizing[2], "SIZING.md states no disk size"
    assert f"--disk_size_gb={sizing[1]}" in launch_argv(tmp_path)
    assert f'DISK_GB=${{DISK_GB:-{sizing[1]}}}' in (DEPLOY / "launch.sh").read_text()
    assert '--additional-pipeline-options="disk_size_gb=$DISK_GB"' in (DEPLOY / "launch.sh").read_text()


def test_the_template_stages_the_same_requirements_for_its_workers(tmp_path):
    """The Flex Template's launcher runs main.py with --setup_file (FLEX_TEMPLATE_PYTHON_SETUP_FILE):
    its workers get the same requirements file as launch.sh's, beside the same sdist."""
    from test_dataflow_template import template_main

    launcher_flags = ["--input=gs://b/in/*.parquet", "--output=gs://b/out", f"--setup_file={REPO / 'setup.py'}",
                      "--project=p", "--region=us-central1", "--temp_location=gs://b/tmp"]
    argv = template_main().job_argv(launcher_flags)
    names = staged_for_workers(argv, tmp_path / "build", tmp_path / "staged")
    assert {"requirements.txt", "workflow.tar.gz"} <= set(names), names
    assert (tmp_path / "staged" / "requirements.txt").read_bytes() == (DEPLOY / "requirements.txt").read_bytes()
