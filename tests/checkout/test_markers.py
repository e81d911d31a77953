"""The test kinds (pyproject.toml's markers, tests/conftest.py): each test has one, from where it lives;
`make test-fast` (-m "unit or smoke") takes the unit tests and the smoke ones; an unknown marker stops
the run (--strict-markers)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO, SMOKE, kind_of


@pytest.mark.parametrize("rel,kind", [
    ("tests/e2e/test_verify.py", "e2e"),
    ("tests/reliability/test_resume.py", "reliability"),
    ("tests/engines/test_engines.py", "engines"),
    ("tests/shards/test_layout.py", "unit"),
    ("tests/transforms/tokenizers/test_encoders.py", "unit"),
    ("tests/checkout/test_markers.py", "unit"),
])
def test_the_kind_is_the_folder(rel, kind):
    assert kind_of(REPO / rel) == kind


def collect(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True)


def test_test_fast_takes_the_unit_tests_and_the_smoke_ones_but_no_other_job_test():
    done = collect("-m", "unit or smoke", "tests/e2e/test_no_byte_changes.py", "tests/e2e/test_verify.py",
                   "tests/transforms/bucketed/test_write.py")
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    byte_net = [i for i in ids if i.startswith("tests/e2e/test_no_byte_changes.py::")]
    assert len(byte_net) == 2 and {i.split("::")[1] for i in byte_net} <= {name.split("::")[1] for name in SMOKE}
    assert not any(i.startswith("tests/e2e/test_verify.py::") for i in ids)
    writes = [i for i in ids if i.startswith("tests/transforms/bucketed/test_write.py::")]
    # test_write's job test says it is e2e; the rest of the module is unit.
    assert writes and not any("one_work_item_per_bucket" in i for i in writes)


def test_an_unknown_marker_stops_the_run(tmp_path):
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.unti\ndef test_x():\n    pass\n")
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    done = collect(str(tmp_path / "test_typo.py"), cwd=tmp_path)
    assert done.returncode != 0 and "'unti' not found in `markers`" in done.stdout + done.stderr


def test_the_venv_targets_are_in_make_help_and_the_training_doc():
    """`make venv-torch` and `make venv-trainers` are listed where a newcomer looks (issue 37), and
    venv-trainers installs what OLMo-core imports when it loads (cached-path's gs:// and s3://)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    help_lines = re.search(r"^help:\n((?:\t.*\n)+)", makefile, flags=re.M).group(1)
    training = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    for target in ("venv-torch", "venv-trainers"):
        assert f"make {target} " in help_lines and f"`make {target}`" in training
    runtime = re.search(r"^TRAINER_RUNTIME := (.*)$", makefile, flags=re.M).group(1).split()
    assert any(r.startswith("google-cloud-storage") for r in runtime) and "boto3" in runtime
    recipe = re.search(r"^\$\(VENV\)/\.installed-trainers:.*\n((?:\t.*\n)+)", makefile, flags=re.M).group(1)
    assert "$(TRAINER_RUNTIME)" in recipe
