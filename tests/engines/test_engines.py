"""Each job on each engine this machine can run, byte for byte against the in-process FnApiRunner.

The reference is a run on the in-process FnApiRunner; every engine then runs the same job on the same
sample with the same flags and must write the same files with the same sha256. Small shard limits
make every job roll over to several files, so the order of documents across files is compared too.
Each engine's wall time is printed at the end of the module.
"""

from __future__ import annotations

import importlib
import time

import pytest
from conftest import SAMPLE_PARQUET
from engine_setup import ENGINES, tree_hashes

from pipelines import bucketed


def _scaffold_run():
    # The scaffold job lands separately; until it does its cases skip instead of breaking collection.
    try:
        return importlib.import_module("pipelines.scaffold").run
    except ImportError as e:
        pytest.skip(f"the scaffold job (pipelines/scaffold.py) is not importable: {e}")


def bucketed_case(request):
    flags = ["--input", str(SAMPLE_PARQUET), "--partitions", "4", "--max-shard-bytes", "120000"]
    return bucketed.run, flags


# Conditions on a boolean and a float column of the sample and on the length in tokens: each
# evaluated on whole Arrow batches, so the kept set (and the bytes) may not depend on the runner.
KEEP = ["--keep", "is_truncated == false", "--keep", "full_doc_lid_score >= 0.95", "--keep", "@tokens <= 20000"]


def bucketed_keep_case(request):
    run, flags = bucketed_case(request)
    return run, [*flags, *KEEP]


def scaffold_case(request):
    run = _scaffold_run()
    gpt2 = request.getfixturevalue("gpt2_spec")  # the GPT-2 ranks shipped in the package
    flags = ["--input", str(SAMPLE_PARQUET), "--annotate", "--long-docs", "chunk", "--tokenizer", gpt2,
             "--shard-tokens", "50000", "--val-fraction", "0.1"]
    return run, flags


# Each job: how to run it on the sample, and a check that its reference output is not trivial.
JOBS = {
    "bucketed": (bucketed_case, lambda files: any(f.endswith("_00001.npy") for f in files)),
    "bucketed-keep": (bucketed_keep_case, lambda files: any(f.endswith("_00001.npy") for f in files)),
    "scaffold": (scaffold_case, lambda files: "val/shard_000.bin" in files and "train/shard_001.bin" in files),
}

WALL_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def report_wall_times(request):
    yield
    if WALL_TIMES:
        plugins = request.config.pluginmanager
        lines = [f"  {name:<24} {seconds:6.1f} s" for name, seconds in WALL_TIMES.items()]
        with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
            plugins.get_plugin("terminalreporter").write_line(
                "\nengine wall times (the job's run() only):\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Per job, the sha256 tree of its in-process FnApiRunner output, computed once."""
    cache = {}

    def get(job: str, run, flags) -> dict[str, str]:
        if job not in cache:
            out = tmp_path_factory.mktemp(f"reference-{job}") / "out"
            start = time.monotonic()
            run([*flags, "--output", str(out), "--runner=FnApiRunner"])
            WALL_TIMES[f"reference/{job}"] = time.monotonic() - start
            cache[job] = tree_hashes(out)
        return cache[job]

    return get


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_engine_writes_the_same_bytes_as_the_fnapi_runner(engine, job, references, request, tmp_path):
    engine_flags = engine.flags()  # skips here, with the reason, when the engine is not set up
    make_case, nontrivial = JOBS[job]
    run, flags = make_case(request)
    expected = references(job, run, flags)
    assert nontrivial(expected), f"the {job} reference output is too small to compare orders: {sorted(expected)}"

    out = tmp_path / "out"
    start = time.monotonic()
    run([*flags, "--output", str(out), *engine_flags])
    WALL_TIMES[f"{engine.name}/{job}"] = time.monotonic() - start

    got = tree_hashes(out)
    assert sorted(got) == sorted(expected), "the engine wrote a different set of files"
    differing = [rel for rel in expected if got[rel] != expected[rel]]
    assert not differing, f"{engine.description}: files differ from the FnApiRunner's: {differing}"
