"""What keys a run's saved work (transforms.core.resume.WorkDescription), and the one line a changed
key gives; markers that no longer match their files are not trusted."""

from __future__ import annotations

import dataclasses

import pytest
from fsspec.implementations.local import LocalFileSystem

from transforms.bucketed.settings import BucketedSettings
from transforms.core import resume
from transforms.core.read import InputUnit

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


def test_a_marker_is_trusted_only_while_its_files_have_their_sizes(tmp_path):
    fs = LocalFileSystem()
    spill = tmp_path / "x.bin"
    spill.write_bytes(b"12345678")
    marker = tmp_path / "000000.done"
    saved = resume.UnitOutputs([(3, "pointer")], {"dropped": [("lid_score", 2)]}, {str(spill): 8})
    marker.write_bytes(saved.to_bytes())
    assert resume.load_marker(fs, str(marker)) == saved
    spill.write_bytes(b"1234")
    assert resume.load_marker(fs, str(marker)) is None
    spill.unlink()
    assert resume.load_marker(fs, str(marker)) is None
    marker.write_bytes(b"not a pickle")
    assert resume.load_marker(fs, str(marker)) is None
    assert resume.load_marker(fs, str(tmp_path / "missing.done")) is None


def test_done_units_are_the_whole_markers(tmp_path):
    units = tmp_path / resume.UNITS_DIR
    units.mkdir()
    for name in ("000000.done", "000002.done", "000003.done.partial-1234", "notes.txt"):
        (units / name).write_bytes(b"")
    assert resume.done_units(str(tmp_path)) == {0, 2}
    assert resume.done_units(str(tmp_path / "nothing-here")) == set()
