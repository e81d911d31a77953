"""A save of the kept runs killed between its temporary file and its os.replace left the file in
the user's cache directory for good (pipelines/progress_prior.py): a later save removes such
orphans, and nothing else."""

from __future__ import annotations

import json
import os
import time

import pytest

from pipelines import progress_prior
from pipelines.progress_prior import Prior, load_prior, save_prior

pytestmark = pytest.mark.unit

KIND = "tokenizer gpt2, 2 workers"
PRIOR = Prior(1.0, 2.0, 1e-6, 2e-7)


def _age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_a_save_removes_its_old_orphans_and_nothing_else(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(progress_prior.CACHE_ENV, str(cache))
    old = 86400.0  # a day: a save killed long ago
    orphan = cache / "job-rates.json.k3x_9qa1.tmp"
    fresh = cache / "job-rates.json.a8bz0c2d.tmp"  # another process's save in progress
    others = [cache / name for name in ("job-rates.json.tmp", "job-rates.json.abc.tmp.keep", "other.json.abc.tmp",
                                        "job-rates.json.abc.TMP", "notes.txt")]
    for path in [orphan, fresh, *others]:
        path.write_text("{}")
    directory = cache / "job-rates.json.dir00000.tmp"
    directory.mkdir()
    target = tmp_path / "elsewhere.json"  # a symlink of an orphan's name: neither it nor its target goes
    target.write_text("keep")
    link = cache / "job-rates.json.link0000.tmp"
    link.symlink_to(target)
    for path in [orphan, *others, directory, target, link]:
        _age(path, old)

    save_prior(KIND, PRIOR)

    assert not orphan.exists()
    assert fresh.exists() and all(p.exists() for p in others) and directory.is_dir()
    assert link.is_symlink() and target.read_text() == "keep"
    assert load_prior(KIND) == PRIOR  # and the save itself was made


def test_a_cache_directory_that_cannot_be_listed_fails_no_save(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_prior.CACHE_ENV, str(tmp_path / "cache"))
    save_prior(KIND, PRIOR)
    monkeypatch.setattr(os, "scandir", _refuse)
    save_prior(KIND, PRIOR)  # no error, and the save is made all the same
    assert len(json.loads((tmp_path / "cache" / progress_prior.FILE_NAME).read_text())[KIND]) == 2


def _refuse(path):
    raise PermissionError(13, "Permission denied", path)
