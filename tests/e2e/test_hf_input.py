"""hf:// input, first class: a dataset on the Hugging Face hub read through the CLI like a local
file, and a hub file that changes while a job runs caught by the hub's own version of it (its git
blob id or LFS sha256), not by its size. The hub is tests/fake_hub.py, on this machine."""

from __future__ import annotations

import json

import fsspec
import pytest
from fake_hub import FakeHub, blob_id
from test_corpus_shapes import DOCS, FINEWEB, PLAIN, run, shard_hashes, stored, write_fineweb

from shards import storage
from transforms.core.records import BadInputError
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_input
from transforms.inputs.units import check_unchanged

REPO = "org/mini"


@pytest.fixture
def hub(monkeypatch):
    """The fake hub, and hf:// URLs pointed at it (as HF_ENDPOINT would, for this process)."""
    with FakeHub(REPO) as hub:
        monkeypatch.setitem(fsspec.config.conf, "hf", {"endpoint": hub.endpoint})
        yield hub


def test_a_fineweb_parquet_on_the_hub_gives_the_bytes_of_the_same_file_read_locally(hub, tmp_path):
    write_fineweb(tmp_path / "fineweb.parquet")
    data = (tmp_path / "fineweb.parquet").read_bytes()
    hub.files["sample/10BT/000_00000.parquet"] = data
    hub.files["sample/10BT/README.md"] = b"not input"
    url = f"hf://datasets/{REPO}/sample/10BT/*.parquet"
    assert run(url, tmp_path / "from-hub", *FINEWEB) == 0
    assert run(tmp_path / "fineweb.parquet", tmp_path / "local", *FINEWEB) == 0
    assert shard_hashes(tmp_path / "from-hub") == shard_hashes(tmp_path / "local")
    assert len(stored(tmp_path / "from-hub")) == len(DOCS)


def test_plain_jsonl_in_a_hub_directory(hub, tmp_path):
    lines = [json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS]
    hub.files["data/part-0.jsonl"] = "".join(lines[:2]).encode()
    hub.files["data/nested/part-1.jsonl"] = "".join(lines[2:]).encode()
    assert run(f"hf://datasets/{REPO}/data", tmp_path / "out", *PLAIN) == 0
    assert stored(tmp_path / "out") == dict(DOCS)


def test_a_hub_file_rewritten_with_the_same_size_is_caught(hub):
    hub.files["data/a.jsonl"] = b'{"id": "a", "text": "hello"}\n'
    [unit] = plan_input(ReadConfig(f"hf://datasets/{REPO}/data/a.jsonl", with_lid=False))
    assert unit.fingerprint == f"size=29 version=blob_id:{blob_id(hub.files['data/a.jsonl'])}"
    check_unchanged(unit)  # as planned
    hub.files["data/a.jsonl"] = b'{"id": "a", "text": "jello"}\n'  # same size, other bytes
    with pytest.raises(BadInputError, match=r"data/a\.jsonl: changed while the job ran \(size=29 version=blob_id:"):
        check_unchanged(unit)


def test_a_missing_huggingface_hub_names_the_extra(monkeypatch):
    import sys

    registry = sys.modules["fsspec.registry"]
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    monkeypatch.delitem(registry._registry, "hf", raising=False)  # the class an earlier hf:// use registered
    with pytest.raises(ImportError, match=r"hf:// paths need huggingface_hub: pip install 'beam-pretokenize\[hf\]'"):
        storage.filesystem(f"hf://datasets/{REPO}/data")


def test_a_download_refused_while_the_job_runs_is_one_line_naming_the_file(hub, tmp_path, capsys):
    # A JSON lines file is planned from the listing alone; its worker is the first to download it.
    hub.files["data/part-0.jsonl"] = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS).encode()
    hub.refuse_downloads = True
    assert run(f"hf://datasets/{REPO}/data", tmp_path / "out", *PLAIN) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if " INFO " not in line]
    assert len(err) == 1, err
    assert err[0].startswith(f"pretokenize bucketed: cannot reach hf://datasets/{REPO}/data/part-0.jsonl: access "
                             "refused (check the credentials): ")
    assert "Access to this resource is forbidden; nothing was published" in err[0]
    assert not (tmp_path / "out" / "dataset_stats.txt").exists()
