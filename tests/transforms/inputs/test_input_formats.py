"""The input formats' registry: which format reads which file, and that each entry's module holds it."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from transforms.core.records import BadInputError
from transforms.inputs import registry
from transforms.inputs.compression import COMPRESSIONS
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_file


@pytest.mark.parametrize("entry", registry.FORMATS, ids=lambda e: e.kind)
def test_each_entry_names_a_module_whose_format_has_its_kind(entry):
    fmt = importlib.import_module(entry.module).FORMAT
    assert fmt.kind == entry.kind
    assert registry.format_of(entry.kind) is fmt
    assert all(s == s.lower() and s.startswith(".") for s in entry.suffixes)


def test_a_kind_no_entry_has_is_refused():
    with pytest.raises(ValueError, match="no input format of kind 'transforms.inputs.read'"):
        registry.format_of("transforms.inputs.read")


@pytest.mark.parametrize(("name", "json_values", "kind"), [
    ("a.parquet", False, "parquet"),
    ("A.PQ", False, "parquet"),
    ("a.jsonl", True, "jsonl"),
    ("a.ndjson.zst", True, "jsonl"),
    ("a.json", False, "jsonl"),
    ("a.json", True, "json"),
    ("a.json.gz", True, "json"),
    ("a.JSON.XZ", False, "jsonl"),
])
def test_the_first_entry_that_matches_reads_the_file(name, json_values, kind):
    assert registry.format_for(name, ReadConfig(name, json_values=json_values)).kind == kind
    assert registry.is_input_file(name)


@pytest.mark.parametrize("name", ["a.txt", "a.parquet.bak", "a.gz", "jsonl", "a.jsonl.zip"])
def test_a_file_no_format_reads(name):
    assert registry.format_for(name, ReadConfig(name, json_values=True)) is None
    assert not registry.is_input_file(name)


def test_an_unknown_file_is_refused_naming_every_suffix_that_is_read(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(BadInputError) as e:
        plan_file(str(path), ReadConfig(str(path)))
    assert e.value.where == str(path) and e.value.problem.startswith("unknown file type; expected .parquet or .pq, or")
    compressions = [ext for ext in COMPRESSIONS if ext]
    assert all(ext in e.value.problem for ext in compressions)
    for entry in registry.FORMATS:
        for suffix in entry.suffixes:
            base = next((suffix[: -len(ext)] for ext in compressions if suffix.endswith(ext)), suffix)
            assert base in e.value.problem, (entry.kind, suffix)


def test_a_json_file_is_planned_as_the_format_its_config_asks_for(tmp_path):
    path = tmp_path / "docs.json"
    path.write_text(json.dumps([{"id": "a", "text": "x"}]))
    for json_values, kind in ((False, "jsonl"), (True, "json")):
        (unit,) = plan_file(str(path), ReadConfig(str(path), with_lid=False, json_values=json_values))
        assert (unit.kind, unit.row_group, unit.rows, unit.text_bytes) == (kind, -1, -1, path.stat().st_size)


def test_the_registry_and_discovery_import_no_arrow_and_no_beam():
    code = ("import sys; import transforms.inputs.discover, transforms.inputs.registry, transforms.inputs.fields, "
            "transforms.inputs.units; print([m for m in ('pyarrow', 'apache_beam') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
