"""pretokenize train-bpe end to end through the CLI, the tokenizer files it writes, and trained:DIR in a job."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
from apache_beam.testing.util import assert_that, equal_to
from tokenizers import Tokenizer

from pipelines import cli, summary
from shards import tokenizer_files as files
from shards import tree
from tests.conftest import REPO, SAMPLE_PARQUET, fnapi_pipeline
from transforms.bpe import pretokenize as pt
from transforms.bpe.count import CountConfig, CountWords, prune, read_count_shards
from transforms.core.batches import DocBatch
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.probe import PROBE

SOURCES = REPO / "tests" / "data" / "sample_sources"
MULTILINGUAL = sorted(SOURCES.glob("udhr_*.txt")) + sorted(SOURCES.glob("cpython_cjkencodings_*.txt"))
SAMPLE_TEXTS = pq.read_table(SAMPLE_PARQUET, columns=["text"]).column("text").to_pylist()
FNAPI = "--runner=FnApiRunner"


def train(tmp: Path, *flags: str) -> Path:
    out = tmp / "tok"
    code = cli.main(["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(out), *flags, FNAPI])
    assert code == 0
    return out


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])
def trained(request, tmp_path_factory) -> tuple[str, Path]:
    """A tokenizer learnt from every document of the sample (all languages), once per pattern."""
    out = train(tmp_path_factory.mktemp(request.param), "--language", "none", "--token-count-field", "none",
                "--vocab-size", "3000", "--pattern", request.param)
    return request.param, out


def ranks_of(directory: Path) -> dict[bytes, int]:
    ranks = {}
    for line in (directory / files.TIKTOKEN_NAME).read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def test_the_directory_holds_its_files_with_provenance(trained):
    pattern, out = trained
    assert sorted(p.name for p in out.iterdir()) == sorted([*files.FILES, tree.RECORD_NAME])
    assert sorted(tree.owned(str(out), "tokenizer").files) == sorted(files.FILES)
    info = json.loads((out / files.INFO_NAME).read_text())
    assert info["pattern"] == pattern and info["alphabet"] == "bytes"
    assert info["ranks"] == 2999 and info["eos_id"] == 2999 and info["merges"] == 2999 - 256
    assert "--vocab-size" in info["flags"] and info["version"]
    for name, digest in info["sha256"].items():
        assert files.sha256((out / name).read_bytes()) == digest
    ranks = ranks_of(out)
    assert sorted(ranks.values()) == list(range(2999))
    assert all(ranks[bytes([b])] == b for b in range(256))
    merges = (out / files.MERGES_NAME).read_text().splitlines()
    assert merges[0].startswith("#version: 0.2 beam-pretokenize") and "train-bpe" in merges[0]
    hf = json.loads((out / files.HF_NAME).read_text())
    assert [" ".join(m) for m in hf["model"]["merges"]] == merges[1:]
    assert hf["added_tokens"][0]["content"] == "<|endoftext|>" and hf["added_tokens"][0]["id"] == 2999
    # Merge k is rank 256 + k: its bytes are its two parts' bytes.
    by_rank = {r: t for t, r in ranks.items()}
    vocab = hf["model"]["vocab"]
    for k, (a, b) in enumerate(hf["model"]["merges"]):
        assert vocab[a] < 256 + k and vocab[b] < 256 + k
        assert by_rank[256 + k] == by_rank[vocab[a]] + by_rank[vocab[b]]
    stats = (out / files.STATS_NAME).read_text()
    for line in ("documents read: 190", "documents kept: 190", "merges: 2743", "vocabulary size: 3000",
                 f"pattern: {pattern}", "first 50 merges:"):
        assert line in stats
    characters = sum(len(t) for t in SAMPLE_TEXTS)
    assert f"characters: {characters}\n" in stats
    assert f"pre-tokens: {sum(len(pt.pre_tokens(t, pattern)) for t in SAMPLE_TEXTS)}\n" in stats


def test_tiktoken_and_hf_files_give_the_same_ids(trained):
    pattern, out = trained
    ranks = ranks_of(out)
    enc = tiktoken.Encoding("trained", pat_str=pt.PATTERNS[pattern], mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    hf = Tokenizer.from_file(str(out / files.HF_NAME))
    hf.encode_special_tokens = True  # "<|endoftext|>" inside a text is text, as tiktoken's encode_ordinary has it
    texts = SAMPLE_TEXTS + [p.read_text(encoding="utf-8") for p in MULTILINGUAL]
    texts += [t for name, t in PROBE.items() if name != "lone_surrogate"]
    want = [enc.encode_ordinary(t) for t in texts]
    got = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    # Encoding the training text gives the learner's own count of tokens after the merges.
    after = int((out / files.STATS_NAME).read_text().split("tokens after merges: ")[1].split()[0])
    assert sum(len(ids) for ids in want[:len(SAMPLE_TEXTS)]) == after
    assert sum(len(ids) for ids in want) > 100_000
    for text, w, g in zip(texts, want, got, strict=True):
        assert w == g, text[:80]
    # And the job's encoder (trained:DIR) gives tiktoken's ids.
    ours = load_encoder(f"trained:{out}")
    assert ours.eos_id == len(ranks) and ours.vocab_size == len(ranks) + 1
    assert [a.tolist() for a in ours.encode_arrays(texts)] == want
    # Decoding gives the text back.
    assert hf.decode(got[0]) == texts[0] and enc.decode(want[-3]) == texts[-3]


def test_auto_tokenizer_loads_the_directory_with_its_eos_and_encodes_as_tiktoken(trained):
    from transformers import AutoTokenizer

    pattern, out = trained
    info = json.loads((out / files.INFO_NAME).read_text())
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == info["eos_id"] == 2999
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # listed with their sha256, as every file
        assert info["sha256"][name] == files.sha256((out / name).read_bytes())
    assert tok.bos_token is None and tok.all_special_tokens == ["<|endoftext|>"]
    assert tok.convert_ids_to_tokens(2999) == "<|endoftext|>" and len(tok) == 3000
    ranks = ranks_of(out)
    enc = tiktoken.Encoding("trained", pat_str=pt.PATTERNS[pattern], mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    texts, size = [], 0
    for text in SAMPLE_TEXTS:  # real text: the sample's documents, in order, until 100 kB
        texts.append(text)
        size += len(text.encode("utf-8"))
        if size >= 100_000:
            break
    assert size >= 100_000
    want = [enc.encode_ordinary(t) for t in texts]
    assert [tok.encode(t) for t in texts] == want  # the defaults: nothing added around a text
    assert tok(texts, add_special_tokens=True)["input_ids"] == want
    assert tok.decode(want[0]) == texts[0]
    # The EOS a job appends is the tokenizer's EOS, and decodes as its text.
    assert tok.decode([*want[1], enc.eot_token]) == texts[1] + "<|endoftext|>"


def test_the_same_files_with_two_worker_processes_and_other_count_shards(tmp_path):
    one = train(tmp_path / "one", "--vocab-size", "1200")
    two = train(tmp_path / "two", "--vocab-size", "1200", "--direct_running_mode=multi_processing",
                "--direct_num_workers=2", "--count-shards", "3")
    for name in (files.TIKTOKEN_NAME, files.HF_NAME):
        assert (one / name).read_bytes() == (two / name).read_bytes()

    def body(path: Path) -> list[str]:  # all but the line naming the flags
        return path.read_text().splitlines()[1:]

    assert body(one / files.STATS_NAME) == body(two / files.STATS_NAME)
    assert body(one / files.MERGES_NAME) == body(two / files.MERGES_NAME)
    assert "documents kept: 149" in (one / files.STATS_NAME).read_text()  # the language filter, as bucketed


TEXTS = ["the cat sat on the mat", "the dog", "a cat, a dog and the end", "Zebra zebra ZEBRA"]


@pytest.mark.parametrize("min_count,max_words", [(1, 0), (2, 0), (1, 3), (2, 2)])
def test_counting_on_beam_is_the_plain_count_pruned_by_the_rule(tmp_path, min_count, max_words):
    config = CountConfig("gpt2", str(tmp_path), shards=3, min_count=min_count, max_words=max_words)
    batches = [DocBatch("f", pa.RecordBatch.from_pydict({"row": [i], "id": [str(i)], "text": [t]}))
               for i, t in enumerate(TEXTS)]
    with fnapi_pipeline() as p:
        counted = p | "Batches" >> beam.Create(batches) | "CountWords" >> CountWords(config)
        totals = counted["distinct"] | "SumDistinct" >> beam.CombinePerKey(sum)
        assert_that(totals, equal_to([("distinct_words", len(pt.count_words(TEXTS, "gpt2")))]), label="Distinct")
    plain = pt.count_words(TEXTS, "gpt2")
    want = sorted(((w, n) for w, n in plain.items() if n >= min_count), key=lambda wn: (-wn[1], wn[0].encode()))
    if max_words:
        want = want[:max_words]
    assert read_count_shards(config) == sorted(want, key=lambda wn: wn[0].encode())


def test_pruning_keeps_the_most_frequent_ties_by_utf8_bytes():
    counts = Counter({"b": 3, "a": 3, "é": 5, "c": 1, "Z": 3})
    assert prune(counts, 1, 3) == [("Z", 3), ("a", 3), ("é", 5)]
    assert prune(counts, 2, 0) == [("Z", 3), ("a", 3), ("b", 3), ("é", 5)]
    assert prune(counts, 6, 0) == []


@pytest.mark.parametrize("trained", ["qwen2"], indirect=True)
def test_bucketed_job_with_a_trained_tokenizer_verifies_against_its_source(trained, tmp_path):
    _, tok = trained
    out = tmp_path / "shards"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--tokenizer",
                     f"trained:{tok}", "--eos-token", "<|endoftext|>", "--dtype", "uint16", FNAPI]) == 0
    stats = (out / "dataset_stats.txt").read_text()
    assert f"trained:{tok}" in stats
    # Every stored document is the trained encoding of its text followed by EOS 2999: verify re-tokenizes them.
    assert cli.main(["verify", "--output", str(out), "--input", str(SAMPLE_PARQUET), FNAPI]) == 0
    shards = sorted(out.rglob("*.npy"))
    tokens = np.concatenate([np.fromfile(s, dtype=np.uint16) for s in shards])
    assert tokens.max() == 2999 and int((tokens == 2999).sum()) == 149


@pytest.mark.parametrize("trained", ["gpt2"], indirect=True)
def test_errors_are_one_line(trained, tmp_path, capsys):
    _, tok = trained
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "a"), "--tokenizer",
                     f"trained:{tok}", "--eos-token", "<|im_end|>", FNAPI]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has the EOS '<|endoftext|>'" in err, err  # no log line before it
    chars = train(tmp_path / "chars", "--merges", "20", "--alphabet", "chars", "--pattern", "chars")
    assert "alphabet: chars" in (chars / files.STATS_NAME).read_text()
    capsys.readouterr()
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "b"), "--tokenizer",
                     f"trained:{chars}", FNAPI]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--alphabet chars" in err, err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert cli.main(["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(foreign), "--merges", "5",
                     FNAPI]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not empty and was not written by pretokenize" in err, err
    assert (foreign / "notes.txt").read_text() == "mine"


def test_a_second_run_replaces_the_tokenizer(tmp_path):
    out = train(tmp_path, "--merges", "10")
    assert "merges: 10\n" in (out / files.STATS_NAME).read_text()
    train(tmp_path, "--merges", "30", "--pattern", "gpt2")
    assert "merges: 30\n" in (out / files.STATS_NAME).read_text()
    assert len(ranks_of(out)) == 286
    assert not (out / ".pretokenize-tmp").exists() or not any((out / ".pretokenize-tmp").iterdir())


def test_scaffold_job_takes_a_tokenizer_with_gpt2_id_layout(tmp_path):
    """--vocab-size 50257 gives GPT-2's layout (50,256 ranks, EOS 50256), which the countdown ids need.
    The corpus: every 4-letter word over 16 letters, so that 50,000 merges exist to be learnt."""
    import itertools
    import json as json_

    from shards import llmc

    letters = "abcdefghijklmnop"
    words = ["".join(w) for w in itertools.product(letters, repeat=4)]
    corpus = tmp_path / "words.jsonl"
    corpus.write_text("".join(json_.dumps({"id": f"d{i}", "text": " ".join(words[i::4])}) + "\n" for i in range(4)))
    tok = tmp_path / "tok"
    assert cli.main(["train-bpe", "--input", str(corpus), "--output", str(tok), "--language", "none",
                     "--token-count-field", "none", "--pattern", "gpt2", "--vocab-size", "50257", FNAPI]) == 0
    assert "vocabulary size: 50257" in (tok / files.STATS_NAME).read_text()
    out = tmp_path / "scaffold"
    plain = REPO / "tests" / "data" / "scaffold" / "por_plain.jsonl"
    assert cli.main(["scaffold", "--input", str(plain), "--output", str(out), "--annotate", "--tokenizer",
                     f"trained:{tok}", "--val-fraction", "0", FNAPI]) == 0
    shards = sorted((out / "train").glob("shard_*.bin"))
    tokens = np.concatenate([np.fromfile(p, dtype="<u2", offset=llmc.HEADER_BYTES) for p in shards])
    encoder = load_encoder(f"trained:{tok}")
    text_ids = tokens[tokens < 50256]
    assert "Declaração" in encoder.backend.decode(text_ids.tolist())
    stats = summary.read_stats(str(out))
    assert stats.tokenizer == f"trained:{tok}" and stats.raw_documents == sum(1 for _ in plain.open())
    assert (tokens == 50256).sum() == stats.kept_documents == stats.raw_documents - 1  # one over 1,000 words


def _one_line_refusal(capsys, argv) -> str:
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err[-3000:]  # the error alone: the input's units are logged after the load
    return err


@pytest.mark.parametrize("trained", ["gpt2"], indirect=True)
def test_a_trained_tokenizer_is_used_only_whole(trained, tmp_path, capsys):
    """trained:DIR needs train-bpe's commit point and every file tokenizer_info.json records with
    its sha256: a half-published directory (a train-bpe killed while publishing: no
    training_stats.txt, a new tokenizer.tiktoken beside the old files) and a one-byte hand edit of
    any recorded file are refused in one line naming the file, exit 2, nothing written."""
    import shutil

    _, tok = trained

    def bucketed(directory, out):
        return ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / out), "--tokenizer",
                f"trained:{directory}", FNAPI]

    half = tmp_path / "half"
    shutil.copytree(tok, half)
    other = train(tmp_path / "other", "--merges", "40", "--pattern", "gpt2")
    (half / files.STATS_NAME).unlink()  # train-bpe removes the commit point first, then writes the files
    shutil.copyfile(other / files.TIKTOKEN_NAME, half / files.TIKTOKEN_NAME)
    err = _one_line_refusal(capsys, bucketed(half, "a"))
    assert f"{half / files.STATS_NAME} not found" in err and "did not finish publishing" in err
    assert not (tmp_path / "a" / "dataset_stats.txt").exists()
    # The commit point back, the ranks still not those recorded.
    shutil.copyfile(tok / files.STATS_NAME, half / files.STATS_NAME)
    err = _one_line_refusal(capsys, bucketed(half, "b"))
    assert f"{half / files.TIKTOKEN_NAME} has sha256" in err and "tokenizer_info.json records" in err

    for name in (files.TIKTOKEN_NAME, files.HF_NAME, files.MERGES_NAME):
        edited = tmp_path / f"edited-{name}"
        shutil.copytree(tok, edited)
        data = bytearray((edited / name).read_bytes())
        at = len(data) - 4  # one byte near the end (a rank's digit, a merge's letter, JSON's last brace)
        data[at] = ord("7") if data[at] != ord("7") else ord("8")
        (edited / name).write_bytes(bytes(data))
        err = _one_line_refusal(capsys, bucketed(edited, f"c-{name}"))
        assert f"{edited / name} has sha256" in err and "Traceback" not in err, err

    # Whatever files tokenizer_info.json records are checked: one more (as tokenizer_config.json).
    extra = tmp_path / "extra"
    shutil.copytree(tok, extra)
    (extra / "tokenizer_config.json").write_text('{"model_max_length": 4096}\n')
    info = json.loads((extra / files.INFO_NAME).read_text())
    info["sha256"]["tokenizer_config.json"] = files.sha256(b'{"model_max_length": 1}\n')
    (extra / files.INFO_NAME).write_text(json.dumps(info))
    err = _one_line_refusal(capsys, bucketed(extra, "d"))
    assert f"{extra / 'tokenizer_config.json'} has sha256" in err
    info["sha256"]["tokenizer_config.json"] = files.sha256((extra / "tokenizer_config.json").read_bytes())
    (extra / files.INFO_NAME).write_text(json.dumps(info))
    recorded = set(info["sha256"])
    assert {name for name, _ in load_encoder(f"trained:{extra}").files} == recorded | {files.INFO_NAME}


# The bytes train-bpe learnt on the sample before its steps ran through RunUnits (recorded with the
# PTransform-wrapped pipeline of commit b51e207): the files that name no path and no version.
LEARNT = {
    "removal": {
        files.TIKTOKEN_NAME: "206b8588889ff6c3ce9fad8d72ed602fa614e58d9993f379d7fd88541f6a80e6",
        files.HF_NAME: "b5d585ff6e718ecfa37559e9305b90045af6b591a03053de3a2e5831d522f657",
        files.HF_CONFIG_NAME: "4f1cd6053cf860555c93c27c7b09d5e678ae64cdf384fb06b3da13c1e786d368",
        files.HF_SPECIAL_NAME: "fb65b9f443e448879f71f388cb59994c9b1330a9c7847406d0ce85f9856745e6",
    },
    "chars": {
        files.TIKTOKEN_NAME: "8812882610ee053576055e5cdbd992f5fd19fb4a108025f800af8f7501385207",
        files.HF_NAME: "6d76747acd460971d8ae6e2efad2b3369631342d297f4c4941f69352272cb079",
        files.HF_CONFIG_NAME: "34a9083324d330ae7454796af7c9f95a86f89b2cd6a609360fd39bfa35e14e34",
        files.HF_SPECIAL_NAME: "fb65b9f443e448879f71f388cb59994c9b1330a9c7847406d0ce85f9856745e6",
    },
}


@pytest.mark.parametrize("case", ["removal", "chars"])
def test_the_learnt_files_are_the_bytes_they_were(tmp_path, case):
    import hashlib

    import pyarrow.parquet as pq

    if case == "removal":  # every 7th id of the sample left out, the FinePDFs filter on
        ids = pq.read_table(SAMPLE_PARQUET, columns=["id"]).column("id").to_pylist()
        flagged = tmp_path / "flagged.txt"
        flagged.write_text("".join(f"{i}\n" for i in ids[::7]))
        out = train(tmp_path, "--merges", "300", "--removal-list", str(flagged))
        drops = {"removed": 28, "language": 5, "lid_score": 13, "page_average_lid": 16, "token_count": 2}
    else:
        out = train(tmp_path, "--merges", "80", "--alphabet", "chars", "--pattern", "chars", "--min-count", "2")
        drops = {"language": 6, "lid_score": 14, "page_average_lid": 19, "token_count": 2}
    assert {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in LEARNT[case]} == LEARNT[case]
    stats = (out / files.STATS_NAME).read_text()
    assert "documents read: 190\n" in stats
    for reason, n in drops.items():
        assert f"documents dropped ({reason}): {n}\n" in stats
