"""What keys a run's saved work (transforms.run.resume.WorkDescription), and the one line a changed
key gives; markers that no longer match their files are not trusted."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem

from transforms.bucketed.settings import BucketedSettings
from transforms.inputs.units import InputUnit
from transforms.run import resume

UNITS = [InputUnit("/in/a.parquet", "parquet", 0, 0, "size=10 version=1.0"),
         InputUnit("/in/a.parquet", "parquet", 1, 5, "size=10 version=1.0"),
         InputUnit("/in/b.jsonl", "jsonl", -1, 0, "size=7 version=2.0")]
EXTRA = {"tokenizer_probe": "abc", "removal_ids": "none"}


def describe(settings=None, units=UNITS, extra=EXTRA) -> resume.WorkDescription:
    return resume.WorkDescription.of("bucketed", settings or BucketedSettings("/in", "/out"), units, extra)


def test_the_same_run_has_the_same_key_and_no_difference():
    a, b = describe(), describe()
    assert a.key == b.key and a.difference(b) == ""
    assert resume.WorkDescription.from_json(a.to_json()) == a


def test_output_input_pattern_and_restart_do_not_change_the_key():
    moved = BucketedSettings("/in/*.parquet", "/elsewhere", restart=True)
    assert describe(moved).key == describe().key


@pytest.mark.parametrize(("change", "said"), [
    (lambda: describe(BucketedSettings("/in", "/out", lid_threshold=0.8)), "--lid-threshold changed (0.9 -> 0.8)"),
    (lambda: describe(BucketedSettings("/in", "/out", tokenizer="gpt2")), "--tokenizer changed (jet-nemotron -> gpt2)"),
    (lambda: describe(extra={**EXTRA, "tokenizer_probe": "def"}), "the tokenizer encodes differently"),
    (lambda: describe(extra={**EXTRA, "removal_ids": "x"}), "the ids to leave out changed"),
    (lambda: describe(units=[*UNITS[:2], UNITS[2]._replace(fingerprint="size=8 version=3.0")]),
     "input file /in/b.jsonl changed (size=7 version=2.0 -> size=8 version=3.0)"),
    (lambda: describe(units=UNITS[:2]), "input file /in/b.jsonl is gone"),
    (lambda: describe(units=[*UNITS, InputUnit("/in/c.jsonl", "jsonl", -1, 0, "size=1 version=1")]),
     "input file /in/c.jsonl is new"),
    (lambda: dataclasses.replace(describe(), tool="0.2.0 code 0123"), "the tool changed ("),
])
def test_a_change_gives_another_key_and_says_what_changed(change, said):
    old, new = describe(), change()
    assert new.key != old.key
    assert said in new.difference(old)


def spilled_unit(work):
    """A unit's outputs as SpillTokensFn gives them, its files under ``work``/spill."""
    import types

    from transforms.core.batches import TokenBatch
    from transforms.core.spill import SpillTokensFn

    fn = SpillTokensFn(types.SimpleNamespace(spill_url=str(work / "spill"), output=str(work)),
                       lambda b, _: ([("train", i % 2) for i in range(b.size)], np.arange(b.size, dtype=np.int64)))
    fn.setup()
    fn.start_bundle()
    batch = TokenBatch("/in/a.jsonl", ["a", "b", "c"], np.arange(3, dtype=np.int64), np.array([2, 1, 3]),
                       np.arange(6, dtype=np.uint32))
    main = list(fn.process(batch))
    main += [w.value for w in fn.finish_bundle()]  # the writer holds batches; its pointers leave at the end
    files = {path: os.path.getsize(path) for path in fn.written_files()}
    return resume.UnitOutputs(main, {"dropped": [("lid_score", 2)], "records": [5]}, files)


def test_a_marker_is_trusted_only_while_its_files_have_their_sizes(tmp_path):
    fs = LocalFileSystem()
    saved = spilled_unit(tmp_path)
    marker = tmp_path / resume.UNITS_DIR / "000000.done"
    marker.parent.mkdir()
    marker.write_bytes(saved.to_bytes(str(tmp_path)))
    assert resume.load_marker(fs, str(marker)) == saved
    spill = next(path for path in saved.files if path.endswith(".bin"))
    with open(spill, "ab") as f:
        f.write(b"1234")
    assert resume.load_marker(fs, str(marker)) is None
    os.unlink(spill)
    assert resume.load_marker(fs, str(marker)) is None
    marker.write_bytes(b"not a marker")
    assert resume.load_marker(fs, str(marker)) is None
    assert resume.load_marker(fs, str(tmp_path / "missing.done")) is None


def test_a_marker_is_data_its_keys_and_values_come_back_as_they_went(tmp_path):
    saved = spilled_unit(tmp_path)
    data = saved.to_bytes(str(tmp_path))
    doc = json.loads(data)
    assert all(not name.startswith("/") for name in doc["files"])  # names, relative to the work directory
    again = resume.UnitOutputs.from_bytes(data, str(tmp_path))
    assert again == saved
    assert sorted(k for k, _ in again.main) == [("train", 0), ("train", 1)]


@pytest.mark.parametrize("edit", [
    lambda d: {**d, "version": 1},
    lambda d: {**d, "files": {"../../victim.bin": 3}},
    lambda d: {**d, "files": {"/etc/passwd": 3}},
    lambda d: {**d, "main": [[0, "../x.refs", 0, 1, 1]]},
    lambda d: {**d, "main": [[0, d["main"][0][1], 0, 10 ** 9, 1]]},  # past the size it recorded
    lambda d: {**d, "main": [[0, d["main"][0][1], -1, 1, 1]]},
    lambda d: {**d, "side": {"dropped": [{"py/object": "os.system"}]}},
    lambda d: {**d, "side": {"records": ["five"]}},
    lambda d: {**d, "side": {"dropped": [["lid_score", -2]]}},
    lambda d: {**d, "files": {k: v for k, v in d["files"].items() if k.endswith(".refs")}},  # no spill file
    lambda d: {**d, "extra": 1},
])
def test_a_marker_that_does_not_validate_is_refused(tmp_path, edit):
    data = spilled_unit(tmp_path).to_bytes(str(tmp_path))
    with pytest.raises(resume.MarkerError):
        resume.UnitOutputs.from_bytes(json.dumps(edit(json.loads(data))).encode(), str(tmp_path))


def test_an_old_pickled_marker_is_redone_never_unpickled(tmp_path, caplog):
    import pickle

    planted = tmp_path / "ran"
    marker = tmp_path / resume.UNITS_DIR / "000000.done"
    marker.parent.mkdir()
    marker.write_bytes(pickle.dumps(Payload(str(planted))))
    assert resume.load_marker(LocalFileSystem(), str(marker)) is None
    assert not planted.exists()
    assert "older format" in caplog.text


class Payload:
    """What a planted pickle would run when unpickled: it creates a file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_done_units_are_the_whole_markers(tmp_path):
    units = tmp_path / resume.UNITS_DIR
    units.mkdir()
    for name in ("000000.done", "000002.done", "000003.done.partial-1234", "notes.txt"):
        (units / name).write_bytes(b"")
    assert resume.done_units(str(tmp_path)) == {0, 2}
    assert resume.done_units(str(tmp_path / "nothing-here")) == set()
