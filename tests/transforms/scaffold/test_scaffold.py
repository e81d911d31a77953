"""The scaffold encoding: marker parsing, the --annotate rule, countdown ids, the long-document
policy and the split, as plain functions and through EncodeScaffold."""

from __future__ import annotations

import json
import re

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import fnapi_pipeline
from doc_batches import doc_batches, documents_of, sequences_of

from shards import llmc
from transforms.core.records import BadInputError, Document
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_input
from transforms.inputs.read import ReadDocuments, read_unit
from transforms.scaffold.encode import (
    COUNTS,
    DROPPED,
    DocumentCounts,
    EncodeScaffold,
    ScaffoldConfig,
    WordEncoder,
    annotate,
    check_gpt2_vocabulary,
    countdown_tokens,
    encode_document,
    encode_documents,
    format_annotated,
    parse_annotated,
    plan_sequences,
    sum_counts,
)
from transforms.tokenizers.load import load_encoder

# The dataset card's example, and its ids written out by hand: <ff_N> = 50257 + N, then each word's
# GPT-2 ids encoded on its own, without a leading space ("O" is 46; " O" would be 440), then EOT.
CARD_EXAMPLE = "<ff_6> O <ff_5> presidente <ff_4> anunciou <ff_3> novas <ff_2> medidas <ff_1> econômicas <ff_0> ."
CARD_IDS = [
    50263, 46,                          # <ff_6> O
    50262, 22540, 68,                   # <ff_5> president|e
    50261, 272, 49652, 280,             # <ff_4> an|unci|ou
    50260, 37302, 292,                  # <ff_3> nov|as
    50259, 1150, 24496,                 # <ff_2> med|idas
    50258, 721, 261, 27083, 9383, 292,  # <ff_1> ec|on|ô|mic|as
    50257, 13,                          # <ff_0> .
    50256,                              # EOT
]


def doc(doc_id: str, text: str, row: int = 0) -> Document:
    return Document(id=doc_id, text=text, source="mem", row=row)


@pytest.fixture(scope="module")
def words_encoder(gpt2_spec):
    return WordEncoder(load_encoder(gpt2_spec), cache_size=1000)


def test_the_card_example_gives_the_ids_written_out_by_hand(gpt2_spec, words_encoder):
    config = ScaffoldConfig(tokenizer=gpt2_spec, val_fraction=0.0)
    result = encode_document(doc("1", CARD_EXAMPLE), config, words_encoder)
    assert result.drop_reason is None
    [seq] = result.sequences
    assert seq.tokens.dtype == np.dtype("<u2")
    assert seq.tokens.tolist() == CARD_IDS
    assert result.counts == DocumentCounts(documents=1, sequences=1, words=7, tokens=len(CARD_IDS),
                                           countdown_mismatches=0)
    # The same sentence as plain text through --annotate: the period is split off as its own word.
    plain = ScaffoldConfig(tokenizer=gpt2_spec, annotate=True, val_fraction=0.0)
    result = encode_document(doc("1", "O presidente anunciou novas medidas econômicas."), plain, words_encoder)
    assert result.sequences[0].tokens.tolist() == CARD_IDS


def test_markers_are_parsed_exactly_and_angle_brackets_stay_text():
    parsed = parse_annotated("<ff_4> a<b <ff_3> x > y <ff_2> <ff_x> <ff_1> <ff_-1> <ff_0> <b>")
    # '<ff_x>' and '<ff_-1>' are not markers: they are words (text), kept whole.
    assert parsed.words == ["a<b", "x > y", "<ff_x>", "<ff_-1>", "<b>"]
    assert not parsed.mismatch
    # Digits of other scripts do not make a marker: re's \d would take '٣'.
    assert parse_annotated("<ff_٣> palavra").words == ["<ff_٣> palavra"]
    # Whitespace around words goes, whitespace inside a word between markers stays.
    assert parse_annotated("<ff_1>\n  São Paulo\t<ff_0>  . ").words == ["São Paulo", "."]


@pytest.mark.parametrize(
    "text, words",
    [
        ("<ff_2> um <ff_1> dois <ff_0> três", ["um", "dois", "três"]),
        ("<ff_3> um <ff_1> dois <ff_0> três", ["um", "dois", "três"]),  # says 3 words remain: there are 2
        ("<ff_2> um <ff_1> <ff_0> três", ["um", "três"]),  # a marker with no word
        ("título <ff_1> um <ff_0> dois", ["título", "um", "dois"]),  # text before the first marker
        ("sem marcadores", ["sem marcadores"]),
    ],
)
def test_the_countdown_is_recomputed_and_a_mismatch_flagged(text, words):
    parsed = parse_annotated(text)
    assert parsed.words == words
    assert parsed.mismatch == (text != "<ff_2> um <ff_1> dois <ff_0> três")


def test_word_limits_stop_the_scan_and_huge_markers_are_only_text():
    text = format_annotated([f"w{i}" for i in range(50)])
    assert parse_annotated(text, limit=3).words == ["w0", "w1", "w2"]
    assert parse_annotated(text, limit=60) == parse_annotated(text) == ([f"w{i}" for i in range(50)], False)
    assert annotate("um, dois três", limit=2) == ["um", ","] and annotate("um dois", limit=9) == ["um", "dois"]
    # A countdown of thousands of digits is compared as digits (int() refuses over 4,300 of them).
    assert parse_annotated(f"<ff_{'9' * 5000}> a <ff_0> b") == (["a", "b"], True)
    assert parse_annotated("<ff_01> a <ff_000> b") == (["a", "b"], False)


def test_the_annotate_rule_on_portuguese_text():
    text = ("Os Estados‐Membros comprometeram-se, em 10/12/1948, a promover o respeito d'água: "
            "1.948 ou 3,5% às 10:30 — «Olá»! a<b x_y ...")
    assert annotate(text) == [
        "Os", "Estados‐Membros", "comprometeram-se", ",", "em", "10/12/1948", ",", "a", "promover", "o",
        "respeito", "d'água", ":", "1.948", "ou", "3,5", "%", "às", "10:30", "—", "«", "Olá", "»", "!",
        "a", "<", "b", "x", "_", "y", ".", ".", ".",
    ]
    # A decomposed accent (e + U+0301) stays inside its word; whitespace of any kind only separates.
    assert annotate("cafe\u0301\u00a0e\tchá\n") == ["cafe\u0301", "e", "chá"]
    assert annotate("   \n ") == []


def test_format_annotated_is_the_inverse_of_parsing():
    words = ["A", "Declaração", "1<2", "."]
    text = format_annotated(words)
    assert text == "<ff_3> A <ff_2> Declaração <ff_1> 1<2 <ff_0> ."
    assert parse_annotated(text) == (words, False)


def test_countdown_tokens_layout():
    tokens = countdown_tokens([[7], [8, 9], [10]])
    assert tokens.tolist() == [50259, 7, 50258, 8, 9, 50257, 10, 50256]
    assert countdown_tokens([[5]] * 1000)[0] == 51256
    with pytest.raises(ValueError, match="1..1000 words"):
        countdown_tokens([[5]] * 1001)
    with pytest.raises(ValueError, match="at least one BPE id"):
        countdown_tokens([[5], []])


def test_long_document_policy():
    words = [f"w{i}" for i in range(2500)]
    assert plan_sequences(words[:1000], "skip") == [words[:1000]]
    assert plan_sequences(words[:1001], "skip") is None
    chunks = plan_sequences(words, "chunk")
    assert [len(c) for c in chunks] == [1000, 1000, 500]
    assert sum(chunks, []) == words
    with pytest.raises(ValueError, match="--long-docs"):
        ScaffoldConfig(long_docs="clamp")


def test_a_1001_word_document_is_dropped_or_chunked_never_clamped(gpt2_spec, words_encoder):
    text = format_annotated(["palavra"] * 1000 + ["fim"])
    skip = encode_document(doc("longo", text), ScaffoldConfig(gpt2_spec, long_docs="skip"), words_encoder)
    assert skip.sequences == [] and skip.drop_reason == "too_many_words"
    chunk = encode_document(doc("longo", text), ScaffoldConfig(gpt2_spec, long_docs="chunk"), words_encoder)
    first, second = chunk.sequences
    assert (first.id, second.id) == ("longo#0", "longo#1")
    ff_first = first.tokens[first.tokens >= llmc.FF_BASE] - llmc.FF_BASE
    assert ff_first.tolist() == list(range(999, -1, -1))
    # The 1,001st word is a document of its own: <ff_0> fim EOT.
    assert second.tokens.tolist() == [50257, *load_encoder(gpt2_spec).encode_batch(["fim"])[0], 50256]
    assert first.split == second.split == llmc.split_of("longo", 0.05)
    assert chunk.counts.documents == 1 and chunk.counts.sequences == 2 and chunk.counts.words == 1001


def test_empty_documents_and_overlong_words_are_dropped_with_reasons(gpt2_spec, words_encoder):
    config = ScaffoldConfig(gpt2_spec, annotate=True, max_word_chars=20)
    assert encode_document(doc("a", " \n\t"), config, words_encoder).drop_reason == "no_words"
    assert encode_document(doc("b", "x" * 21), config, words_encoder).drop_reason == "word_too_long"
    assert encode_document(doc("c", "x" * 20), config, words_encoder).drop_reason is None
    unlimited = ScaffoldConfig(gpt2_spec, annotate=True, max_word_chars=0)
    assert encode_document(doc("b", "x" * 21), unlimited, words_encoder).drop_reason is None
    # Over 1,000 words under skip is too_many_words whatever the words: they are read no further.
    long_with_a_long_word = " ".join(["palavra"] * 1001 + ["x" * 21])
    assert encode_document(doc("d", long_with_a_long_word), config, words_encoder).drop_reason == "too_many_words"
    chunk = ScaffoldConfig(gpt2_spec, annotate=True, max_word_chars=20, long_docs="chunk")
    assert encode_document(doc("d", long_with_a_long_word), chunk, words_encoder).drop_reason == "word_too_long"


def test_the_endoftext_string_is_text_inside_a_word(gpt2_spec, words_encoder):
    result = encode_document(doc("e", "<ff_0> <|endoftext|>"), ScaffoldConfig(gpt2_spec), words_encoder)
    tokens = result.sequences[0].tokens.tolist()
    assert tokens[0] == 50257 and tokens[-1] == 50256
    assert 50256 not in tokens[1:-1] and len(tokens) > 3


def test_the_split_is_a_stable_hash_of_the_id():
    ids = [f"doc-{i}" for i in range(20_000)]
    splits = [llmc.split_of(i, 0.05) for i in ids]
    assert 0.04 < splits.count("val") / len(ids) < 0.06
    assert llmc.split_of("doc-0", 0.0) == "train"
    # A larger fraction only moves documents from train to val, never the other way.
    wider = [llmc.split_of(i, 0.10) for i in ids]
    assert all(w == "val" for s, w in zip(splits, wider, strict=True) if s == "val")
    with pytest.raises(ValueError):
        llmc.split_of("x", 1.0)


def test_the_split_hash_is_pinned():
    # BLAKE2b-64 (little-endian) of the UTF-8 id, personalised "llmc-split", below fraction * 2**64:
    # values from hashlib written down here. If they change, every published split changes.
    assert [llmc.split_of(f"id-{i}", 0.5) for i in range(8)] == [
        "train", "val", "train", "train", "train", "train", "val", "val"]


def test_the_split_does_not_follow_the_shuffle_order():
    from shards.layout import shuffle_key

    ids = sorted((f"doc-{i}" for i in range(4000)), key=lambda i: shuffle_key(i, 0))
    val_positions = [k for k, i in enumerate(ids) if llmc.split_of(i, 0.05) == "val"]
    # Independent hashes: val documents are spread over the whole shuffle order.
    assert min(val_positions) < 400 and max(val_positions) > 3600


def test_the_word_cache_gives_the_same_ids_and_stays_bounded(gpt2_spec):
    encoder = load_encoder(gpt2_spec)
    cached = WordEncoder(encoder, cache_size=3)
    words = ["não", "é", "não", "ação", "é", "direitos", "humanos", "não"]
    expected = encoder.encode_batch(words)
    for _ in range(3):
        assert cached.encode(words) == expected
        assert len(cached._cache) <= 3


def test_a_batch_of_documents_is_encoded_in_one_call_with_the_same_ids(gpt2_spec):
    class CountingEncoder:
        """The GPT-2 encoder, counting its batch calls."""

        def __init__(self, encoder):
            self.encoder, self.calls = encoder, 0

        def encode_batch(self, texts):
            self.calls += 1
            return self.encoder.encode_batch(texts)

    encoder = load_encoder(gpt2_spec)
    long_text = format_annotated([f"palavra{i}" for i in range(2500)])
    docs = [doc("card", CARD_EXAMPLE), doc("empty", " \n"), doc("long", long_text),
            doc("x", "<ff_1> não <ff_0> ação"), doc("bad", "<ff_3> um <ff_0> dois"), doc("card2", CARD_EXAMPLE)]
    for config in (ScaffoldConfig(gpt2_spec, long_docs="skip"), ScaffoldConfig(gpt2_spec, long_docs="chunk")):
        counting = CountingEncoder(encoder)
        batched = encode_documents(docs, config, WordEncoder(counting, cache_size=0))
        one_by_one = [encode_document(d, config, WordEncoder(encoder, cache_size=0)) for d in docs]
        assert counting.calls == 1
        assert [r.drop_reason for r in batched] == [r.drop_reason for r in one_by_one]
        assert [r.counts for r in batched] == [r.counts for r in one_by_one]
        for got, want in zip(batched, one_by_one, strict=True):
            assert [(s.id, s.split, s.words, s.mismatch) for s in got.sequences] == \
                [(s.id, s.split, s.words, s.mismatch) for s in want.sequences]
            assert all(np.array_equal(g.tokens, w.tokens) for g, w in zip(got.sequences, want.sequences, strict=True))
    assert [r.drop_reason for r in batched][:3] == [None, "no_words", None]  # chunk mode, the last config
    assert len(batched[2].sequences) == 3  # 2,500 words chunked by 1,000


def test_a_non_gpt2_tokenizer_is_refused_before_the_job_starts():
    encoder = load_encoder("jet-nemotron")
    with pytest.raises(ValueError, match="GPT-2's vocabulary"):
        check_gpt2_vocabulary(encoder)


def test_sum_counts_adds_element_wise():
    assert sum_counts([DocumentCounts(1, 2, 3, 4, 1), DocumentCounts(1, 1, 1, 1, 0)]) == (2, 3, 4, 5, 1)
    assert sum_counts([]) == (0, 0, 0, 0, 0)


def test_encode_scaffold_transform_routes_sequences_drops_and_counts(gpt2_spec):
    docs = [
        doc("ok", CARD_EXAMPLE),
        doc("vazio", ""),
        doc("errado", "<ff_5> um <ff_0> dois"),
        doc("longo", format_annotated(["x"] * 1001)),
    ]
    config = ScaffoldConfig(gpt2_spec, val_fraction=0.0)
    with fnapi_pipeline() as p:
        out = p | beam.Create(doc_batches(docs, per_batch=2, with_lid=False)) | EncodeScaffold(config)
        sequences = out.sequences | "Sequences" >> beam.FlatMap(sequences_of)
        assert_that(sequences | "Ids" >> beam.MapTuple(lambda i, t, x: (i, t.tolist(), llmc.SPLITS[x["split"]])),
                    equal_to([("ok", CARD_IDS, "train"),
                              ("errado", [50258, 388, 50257, 4598, 271, 50256], "train")]),
                    label="Sequences")
        assert_that(sequences | "Extra" >> beam.MapTuple(lambda i, t, x: (i, x["doc_id"], int(x["words"]),
                                                                           int(x["mismatch"]))),
                    equal_to([("ok", "ok", 7, 0), ("errado", "errado", 2, 1)]), label="Extra")
        assert_that(out[DROPPED] | "SumDrops" >> beam.CombinePerKey(sum),
                    equal_to([("no_words", 1), ("too_many_words", 1)]), label="Drops")
        assert_that(out[COUNTS] | "Sum" >> beam.CombinePerKey(sum_counts),
                    equal_to([("train", (2, 2, 9, len(CARD_IDS) + 6, 1))]), label="Counts")


# --- reading the annotated input forms -------------------------------------------------------------

RECORDS = [{"id": 1, "content-ff": "<ff_1> Olá <ff_0> ."}, {"id": "b", "content-ff": "<ff_0> Adeus"}]


def _read(pattern: str) -> list[Document]:
    """Documents as the job's workers read them: units planned at launch, each read in turn."""
    config = ReadConfig(pattern, text_field="content-ff", with_lid=False, json_values=True)
    return [d for unit in plan_input(config) for d in read_unit(unit, config)]


def test_reads_one_object_per_file_an_array_and_jsonl(tmp_path):
    (tmp_path / "single.json").write_text(json.dumps(RECORDS[0], indent=2, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "array.json").write_text(json.dumps(RECORDS, indent=1, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    (tmp_path / "lines_in.json").write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    config = ReadConfig(str(tmp_path), text_field="content-ff", with_lid=False, json_values=True)
    assert sorted((u.path.rsplit("/", 1)[1], u.kind) for u in plan_input(config)) == [
        ("array.json", "json"), ("lines.jsonl", "jsonl"), ("lines_in.json", "json"), ("single.json", "json")]
    docs = _read(str(tmp_path))
    got = sorted((d.source.rsplit("/", 1)[1], d.row, d.id, d.text) for d in docs)
    assert got == [
        ("array.json", 0, "1", "<ff_1> Olá <ff_0> ."),
        ("array.json", 1, "b", "<ff_0> Adeus"),
        ("lines.jsonl", 0, "1", "<ff_1> Olá <ff_0> ."),
        ("lines.jsonl", 1, "b", "<ff_0> Adeus"),
        ("lines_in.json", 0, "1", "<ff_1> Olá <ff_0> ."),
        ("lines_in.json", 1, "b", "<ff_0> Adeus"),
        ("single.json", 0, "1", "<ff_1> Olá <ff_0> ."),
    ]


def test_json_text_is_read_in_pieces_across_chunk_edges():
    import io

    from transforms.inputs.json_text import _JsonText

    text = json.dumps([{"id": str(i), "content-ff": "á" * (i * 7)} for i in range(60)], ensure_ascii=False)
    values = list(_JsonText(io.BytesIO(text.encode()), "mem", chunk_chars=5).values())
    assert [v["id"] for v in values] == [str(i) for i in range(60)]
    assert all(v["content-ff"] == "á" * (i * 7) for i, v in enumerate(values))
    assert list(_JsonText(io.BytesIO(b" [ ] "), "mem").values()) == []
    assert list(_JsonText(io.BytesIO(b""), "mem").values()) == []


@pytest.mark.parametrize(
    "content, message",
    [
        (b'[{"id": "a", "content-ff": "x"}, ', "record 2: is not JSON"),
        (b'[{"id": "a", "content-ff": "x"} {"id": "b"}]', "record 1: is not followed by ',' or ']'"),
        (b'{"id": "a", "content-ff": "x"} [1]', "record 2: is a JSON list, not an object"),
        (b'{"id": "a"}', "record 1: missing field(s) content-ff"),
        (b'{"id": "a", "content-ff": 3}', "'content-ff' is int"),
        (b'{"id": "a", "content-ff": "\xff"}', "is not valid UTF-8"),
        (b'[{"id": "a", "content-ff": "x"}] {}', "has more text after its JSON array"),
    ],
)
def test_bad_json_input_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(BadInputError, match=re.escape(message)) as info:
        _read(str(path))
    assert str(path) in str(info.value)


def test_json_records_through_the_pipeline(tmp_path):
    (tmp_path / "array.json").write_text(json.dumps(RECORDS, ensure_ascii=False), encoding="utf-8")
    config = ReadConfig(str(tmp_path), text_field="content-ff", with_lid=False, json_values=True)
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(config)).docs | beam.FlatMap(documents_of)
        assert_that(docs | beam.Map(lambda d: (d.id, d.text, d.row)),
                    equal_to([("1", "<ff_1> Olá <ff_0> .", 0), ("b", "<ff_0> Adeus", 1)]))


def test_without_json_values_a_json_file_is_still_read_as_lines(tmp_path):
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(RECORDS[0], indent=2), encoding="utf-8")
    config = ReadConfig(str(path), text_field="content-ff", with_lid=False)
    [unit] = plan_input(config)
    assert unit.kind == "jsonl"
    with pytest.raises(BadInputError, match="line 1: is not JSON"):
        list(read_unit(unit, config))


def test_plain_parquet_with_only_id_and_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "p1", "text": "Olá, mundo."}]), path)
    config = ReadConfig(str(path), with_lid=False, json_values=True)
    docs = [d for unit in plan_input(config) for d in read_unit(unit, config)]
    assert [(d.id, d.text) for d in docs] == [("p1", "Olá, mundo.")]
    with pytest.raises(BadInputError, match="missing column 'content-ff'"):
        ReadDocuments(ReadConfig(str(path), text_field="content-ff", with_lid=False))
