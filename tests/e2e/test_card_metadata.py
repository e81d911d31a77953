"""The dataset card ready for the Hub: license, source_datasets and language in its metadata, from
the flags or from a hub input's own card; inputs named as typed or below their root, never by this
machine's absolute path; local inputs fingerprinted by content when asked (--input-sha256)."""

from __future__ import annotations

import json
import os
import shutil

import fsspec
import pytest
import yaml
from conftest import SAMPLE_PARQUET
from fake_hub import FakeHub
from test_corpus_shapes import DOCS, PLAIN, run

from pipelines import cli
from shards.card import CARD_NAME
from shards.provenance import STATS_JSON_NAME

RUNNER = ["--runner=FnApiRunner"]


def front_matter(tree) -> dict:
    text = (tree / CARD_NAME).read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def every_file(tree):
    for dirpath, _, files in os.walk(tree):
        for name in files:
            yield os.path.join(dirpath, name)


def test_the_card_holds_license_sources_and_language_and_never_the_inputs_absolute_path(tmp_path):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *RUNNER,
                     "--license", "odc-by", "--source-dataset", "HuggingFaceFW/finepdfs-edu"]) == 0
    meta = front_matter(out)
    assert meta["license"] == "odc-by"
    assert meta["source_datasets"] == ["HuggingFaceFW/finepdfs-edu"]
    assert meta["language"] == ["eng"]  # the --language filter's, eng_Latn
    assert meta["viewer"] is False and meta["pretty_name"]
    doc = json.loads((out / STATS_JSON_NAME).read_text())
    assert doc["card"] == {"license": "odc-by", "source_datasets": ["HuggingFaceFW/finepdfs-edu"], "language": ["eng"]}
    # Typed as an absolute path: named below its root, here and everywhere in the tree.
    assert [i["url"] for i in doc["inputs"]] == [SAMPLE_PARQUET.name] and doc["flags"]["input"] == SAMPLE_PARQUET.name
    for path in every_file(out):
        data = open(path, "rb").read()
        assert str(SAMPLE_PARQUET.parent).encode() not in data, path


def test_without_flags_the_licence_is_unknown_and_a_relative_input_is_named_as_typed(tmp_path, monkeypatch):
    shutil.copy(SAMPLE_PARQUET, tmp_path / "sample.parquet")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bucketed", "--input", "sample.parquet", "--output", "out", *RUNNER]) == 0
    meta = front_matter(tmp_path / "out")
    assert meta["license"] == "unknown" and meta["language"] == ["eng"] and "source_datasets" not in meta
    doc = json.loads((tmp_path / "out" / STATS_JSON_NAME).read_text())
    assert [i["url"] for i in doc["inputs"]] == ["sample.parquet"]
    for path in every_file(tmp_path / "out"):
        assert str(tmp_path).encode() not in open(path, "rb").read(), path


def test_a_glob_is_named_below_its_root(tmp_path):
    (tmp_path / "in" / "part").mkdir(parents=True)
    shutil.copy(SAMPLE_PARQUET, tmp_path / "in" / "part" / "a.parquet")
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(tmp_path / "in" / "*" / "*.parquet"), "--output", str(out),
                     *RUNNER]) == 0
    doc = json.loads((out / STATS_JSON_NAME).read_text())
    assert [i["url"] for i in doc["inputs"]] == ["part/a.parquet"] and doc["flags"]["input"] == "*/*.parquet"
    for path in every_file(out):
        assert str(tmp_path).encode() not in open(path, "rb").read(), path


def test_input_sha256_records_a_copy_of_the_same_bytes_the_same(tmp_path):
    docs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(SAMPLE_PARQUET, tmp_path / name / "sample.parquet")
        os.utime(tmp_path / name / "sample.parquet", (1_000_000 * (len(docs) + 1),) * 2)  # other mtimes
        out = tmp_path / f"out-{name}"
        assert cli.main(["bucketed", "--input", str(tmp_path / name / "sample.parquet"), "--output", str(out),
                         *RUNNER, "--input-sha256"]) == 0
        docs.append((out / STATS_JSON_NAME).read_bytes())
    assert docs[0] == docs[1]
    (entry,) = json.loads(docs[0])["inputs"]
    assert entry["fingerprint"].startswith(f"size={SAMPLE_PARQUET.stat().st_size} sha256=")


@pytest.fixture
def hub(monkeypatch):
    with FakeHub("org/mini") as hub:
        monkeypatch.setitem(fsspec.config.conf, "hf", {"endpoint": hub.endpoint})
        yield hub


def test_a_hub_input_gives_its_own_cards_license_and_language_and_is_the_source(hub, tmp_path):
    hub.files["README.md"] = b"---\nlicense: odc-by\nlanguage:\n- en\npretty_name: Mini\n---\n# Mini\n"
    hub.files["data/part-0.jsonl"] = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS).encode()
    assert run("hf://datasets/org/mini/data", tmp_path / "out", *PLAIN) == 0
    meta = front_matter(tmp_path / "out")
    assert meta["license"] == "odc-by" and meta["language"] == ["en"] and meta["source_datasets"] == ["org/mini"]
    # A flag still wins over the input's card.
    assert run("hf://datasets/org/mini/data", tmp_path / "out2", *PLAIN, "--license", "cc-by-4.0") == 0
    assert front_matter(tmp_path / "out2")["license"] == "cc-by-4.0"
