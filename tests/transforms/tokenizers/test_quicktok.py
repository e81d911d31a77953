"""The quicktok backend: the same ids as tiktoken, the probe that proves it on every worker, and
trees that are byte for byte the same whichever backend wrote them."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DEFAULT_FILTER, SAMPLE_PARQUET, tree_hashes

from pipelines import bucketed, cli, verify
from shards import layout
from shards.card import CARD_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from transforms.bucketed.tokenize import TokenizerConfig, encode_batch
from transforms.core.batches import DocBatch
from transforms.tokenizers import probe, quicktok_backend
from transforms.tokenizers.backends import other_backend, resolve_backend
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.probe import PROBE, BackendMismatch

pytest.importorskip("quicktok")

RUNNER = ["--runner=FnApiRunner"]

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog; it's 3.14159 times faster, isn't it?",
    "Příliš žluťoučký kůň úpěl ďábelské ódy. Zażółć gęślą jaźń. Árvíztűrő tükörfúrógép.",
    "В чащах юга жил бы цитрус? Да, но фальшивый экземпляр! Їжак і ґава.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ἐν ἀρχῇ ἦν ὁ λόγος",
    "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت — يَحظى الضَجيعُ بِها نَجلاءَ مِعطارِ ١٢٣٤٥",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。東京都千代田区１−２−３",
    "天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。２０２６年１１月３０日",
    "키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "ሰማይ አይታረስ ንጉሥ አይከሰስ። ᚠᛇᚻ᛫ᛒᛦᚦ ꦲꦤꦕꦫꦏ 𓀀𓁐 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﷺ ﬁ ǅ",
]


@pytest.fixture(scope="module")
def both():
    return load_encoder("jet-nemotron", backend="quicktok"), load_encoder("jet-nemotron", backend="tiktoken")


def assert_same_ids(both, texts):
    fast, reference = both
    tokens, offsets = fast.encode_tokens(texts)
    want = reference.encode_arrays(texts)
    assert len(offsets) == len(texts) + 1
    for i, text in enumerate(texts):
        got = tokens[offsets[i]:offsets[i + 1]]
        assert got.tolist() == want[i].tolist(), f"text {i} differs: {text[:80]!r}"


def test_the_backends_are_what_was_asked_for(both):
    fast, reference = both
    assert fast.library == "quicktok 0.4.0" and reference.library.startswith("tiktoken ")
    assert fast.splitter is None and reference.splitter is not None  # quicktok is linear on long runs
    assert (fast.eos_id, fast.vocab_size) == (reference.eos_id, reference.vocab_size)


def test_the_backends_agree_on_the_bundled_sample(both):
    texts = pq.read_table(SAMPLE_PARQUET, columns=["text"]).column("text").to_pylist()
    assert len(texts) > 100
    assert_same_ids(both, texts)


def test_the_backends_agree_on_multilingual_text(both):
    assert_same_ids(both, MULTILINGUAL + [" ".join(MULTILINGUAL), "\n\n".join(MULTILINGUAL)])


@pytest.mark.parametrize("name", sorted(PROBE))
def test_the_backends_agree_on_each_adversarial_class_long(both, name):
    # Each probe class 40 times over (the letters class: a 250k-character run for quicktok to take whole).
    text = (PROBE[name] if name != "letters" else PROBE[name].replace(" ", "")) * 40
    assert_same_ids(both, [text, PROBE[name], PROBE[name][:7], " " + PROBE[name]])


def test_the_backends_agree_on_empty_and_one_character_texts(both):
    assert_same_ids(both, ["", " ", "\n", "a", "\r\n", "\u0301", "<|endoftext|>", "\ud800", "", "é"])


def test_the_backends_agree_on_random_unicode(both):
    rng = random.Random(13)
    pools = [
        (0x20, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x530), (0x590, 0x700), (0x900, 0xE80),
        (0x1100, 0x1200), (0x2000, 0x2070), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
        (0xFE00, 0xFFFF), (0x1F300, 0x1FAFF), (0x10000, 0x10FFFF),
    ]
    texts = []
    for _ in range(400):
        chars = []
        for _ in range(rng.randrange(1, 200)):
            lo, hi = rng.choice(pools)
            c = rng.randrange(lo, hi)
            chars.append(" " if 0xD800 <= c <= 0xDFFF else chr(c))
            if rng.random() < 0.2:
                chars.append(rng.choice([" ", "  ", "\n", "\r\n", "\t", "\u200d", "'s", "1", "\u0301"]))
        texts.append("".join(chars))
    assert_same_ids(both, texts)


def test_the_backends_agree_on_every_code_point(both):
    # Each code point doubled and between letters and digits, 512 code points a text; this includes
    # the characters Unicode 16 composes (U+1611E twice), which quicktok's own NFC table would compose
    # and Python 3.11's does not: the text quicktok sees is normalized by us.
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(f"x{chr(c)}{chr(c)}1 {chr(c)}a\u0301" for c in cps[i:i + 512]) for i in range(0, len(cps), 512)]
    assert_same_ids(both, texts)


def test_the_probe_costs_milliseconds_and_passes(both):
    seconds = probe.probe(*both)
    assert seconds < 1.0  # a generous bound: it is a few ms; the point is that it passes


class _WrongOnCJK:
    """quicktok, but a character of the CJK probe class encoded as another one."""

    def __init__(self, tok):
        self._tok = tok

    def encode_batch(self, texts, threads, with_special):
        return self._tok.encode_batch([t.replace("中", "申") for t in texts], threads, with_special)


def test_the_probe_stops_a_wrong_backend_with_one_line(monkeypatch):
    real = quicktok_backend.quicktok_tokenizer
    monkeypatch.setattr(quicktok_backend, "quicktok_tokenizer", lambda *a: _WrongOnCJK(real(*a)))
    with pytest.raises(BackendMismatch) as e:
        load_encoder("jet-nemotron", backend="quicktok", cache=None)  # built here, not an earlier test's
    message = str(e.value)
    assert "\n" not in message
    assert "quicktok 0.4.0" in message and "probe's cjk text at token" in message
    # auto is not a way around it.
    with pytest.raises(BackendMismatch):
        load_encoder("jet-nemotron", backend="auto", cache=None)


def test_the_backend_flag_resolves_per_tokenizer(gpt2_spec):
    assert resolve_backend("jet-nemotron", "auto") == "quicktok"
    assert resolve_backend("jet-nemotron", "tiktoken") == "tiktoken"
    assert resolve_backend("gpt2", "auto") == "tiktoken"  # quicktok has no GPT-2 scanner
    assert resolve_backend(gpt2_spec, "auto") == "tiktoken"
    with pytest.raises(ValueError, match="quicktok cannot encode 'gpt2' exactly"):
        resolve_backend("gpt2", "quicktok")
    with pytest.raises(ValueError, match="must be one of auto, quicktok, tiktoken"):
        TokenizerConfig(backend="fast")
    with pytest.raises(ValueError, match="at least 1"):
        TokenizerConfig(threads=0)


def test_a_tree_is_checked_with_the_other_backend():
    assert other_backend("quicktok 0.4.0") == "tiktoken"
    assert other_backend("tiktoken 0.14.0") == "auto"
    assert other_backend(None) == "auto"  # written before the backend was recorded
    assert resolve_backend("jet-nemotron", other_backend("tiktoken 0.14.0")) == "quicktok"


def test_a_token_batch_is_the_same_from_either_backend(both):
    texts = ["first <|endoftext|> doc", "", "Zürich 日本語 \U0001F468\u200D\U0001F469", "a" * 5000, ""]
    table = pa.RecordBatch.from_pylist([{"row": i, "id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    batch = DocBatch("src.jsonl", table)
    got = [encode_batch(e, batch, np.dtype("<u4"), batch_docs=2) for e in both]
    assert got[0].tokens.tolist() == got[1].tokens.tolist()
    assert got[0].lengths.tolist() == got[1].lengths.tolist()
    assert got[0].lengths[1] == 1 and got[0].tokens[-1] == got[0].tokens[-2] == 151643  # EOS only
    assert int(got[0].lengths.sum()) == len(got[0].tokens)


def test_stats_record_the_backend_and_old_stats_still_parse():
    stats = DatasetStats(10, DEFAULT_FILTER, "jet-nemotron", 151643, 151936, "uint32", 32, 0, {}, {},
                         tokenizer_backend="quicktok 0.4.0")
    text = stats.to_text()
    assert "tokenizer_backend: quicktok 0.4.0\n" in text
    parsed = DatasetStats.from_text(text)
    assert parsed.tokenizer_backend == "quicktok 0.4.0" and parsed.to_text() == text
    old = "".join(line + "\n" for line in text.splitlines() if not line.startswith("tokenizer_backend"))
    assert DatasetStats.from_text(old).tokenizer_backend is None


@pytest.mark.e2e  # a whole job
def test_trees_are_byte_identical_across_backends_and_verify_uses_the_other(tmp_path, capsys):
    trees = {}
    for backend in ("quicktok", "tiktoken"):
        out = tmp_path / backend
        flags = ["--tokenizer-backend", backend, *RUNNER]
        assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *flags]) == 0
        trees[backend] = out
    # The stats, dataset_stats.json and the card name the backend; every other byte is the same.
    hashes = {b: tree_hashes(out, skip=(layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME)) for b, out in trees.items()}
    assert len(hashes["quicktok"]) > 80 and hashes["quicktok"] == hashes["tiktoken"]
    stats = {b: (out / layout.STATS_NAME).read_text() for b, out in trees.items()}
    assert "tokenizer_backend: quicktok 0.4.0\n" in stats["quicktok"]
    assert "tokenizer_backend: tiktoken " in stats["tiktoken"]
    strip = [[x for x in s.splitlines() if not x.startswith("tokenizer_backend")] for s in stats.values()]
    assert strip[0] == strip[1]
    capsys.readouterr()
    for backend, other in (("quicktok", "tiktoken"), ("tiktoken", "quicktok")):
        code = verify.run(["--output", str(trees[backend]), "--input", str(SAMPLE_PARQUET), *RUNNER])
        text = capsys.readouterr().out
        assert code == 0 and f"re-encoding the input with {other} " in text, text


def test_the_flags_reach_the_tokenizer_config():
    settings, _ = bucketed.parse_args(["--input", str(SAMPLE_PARQUET), "--output", "y", "--tokenizer-backend",
                                       "tiktoken", "--tokenizer-threads", "4"])
    config = settings.tokenizer_config()
    assert (config.backend, config.threads) == ("tiktoken", 4)
    defaults, _ = bucketed.parse_args(["--input", str(SAMPLE_PARQUET), "--output", "y"])
    assert defaults.tokenizer_config().backend == "auto"


def test_more_threads_give_the_same_ids(both):
    texts = pq.read_table(SAMPLE_PARQUET, columns=["text"]).column("text").to_pylist()
    threaded = load_encoder("jet-nemotron", backend="quicktok", threads=2)
    got, want = threaded.encode_tokens(texts), both[0].encode_tokens(texts)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def _struct_records(ranks: dict[bytes, int]) -> bytes:
    """quicktok's NAME.vocab as its format says it, a struct call per token (the reference)."""
    import struct

    out = [struct.pack("<I", len(ranks))]
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        out.append(struct.pack("<H", len(token)) + token + struct.pack("<I", rank))
    return b"".join(out)


def test_the_vocabulary_quicktok_reads_is_packed_exactly_as_its_format_says():
    from transforms.tokenizers.ranks import load_ranks, qwen_ranks_path

    rng = random.Random(5)
    cases = [load_ranks(qwen_ranks_path()), {}, {b"a": 0}, {b"": 1, b"x" * 300: 0}]
    for _ in range(20):  # the dict's order is not the ranks' order, and ranks may skip
        tokens = list({rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 200))})
        ranks = rng.sample(range(1 << 32), len(tokens))
        cases.append(dict(zip(tokens, ranks, strict=True)))
    for ranks in cases:
        assert quicktok_backend.vocab_records(ranks) == _struct_records(ranks)
    for bad in ({b"x" * 65536: 0}, {b"a": -1}, {b"a": 1 << 32}):
        with pytest.raises(ValueError, match="quicktok"):
            quicktok_backend.vocab_records(bad)
