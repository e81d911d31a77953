"""TokenizeDocuments: ids plus exactly one EOS, in the output dtype, batched."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.testing.util import assert_that, equal_to
from conftest import fnapi_pipeline
from doc_batches import doc_batches, sequences_of

from transforms.bucketed.tokenize import TokenizeDocuments, TokenizerConfig, encode_batch
from transforms.core.records import Document
from transforms.tokenizers.load import load_encoder

TEXTS = {
    "plain": "Hello world",
    "special": "before <|endoftext|> after",
    "accents": "Ação, café, naïve — 東京 🙂",
}


def _docs():
    return [Document(k, v, "f", i) for i, (k, v) in enumerate(TEXTS.items())]


def test_each_document_gets_exactly_one_eos(gpt2_spec):
    encoder = load_encoder(gpt2_spec)
    [batch] = doc_batches(_docs(), with_lid=False)
    out = encode_batch(encoder, batch, np.dtype("<u2"), batch_docs=2)
    assert out.tokens.dtype == np.dtype("<u2")
    assert out.ids == list(TEXTS) and out.rows.tolist() == [0, 1, 2] and out.source == "f"
    assert int(out.lengths.sum()) == len(out.tokens)
    sequences = sequences_of(out)
    for doc_id, tokens, _ in sequences:
        assert tokens[-1] == 50256
        assert int((tokens == 50256).sum()) == 1
        assert encoder_decode(tokens[:-1]) == TEXTS[doc_id]
    assert sequences[0][1].tolist() == [15496, 995, 50256]


def encoder_decode(ids):
    import tiktoken
    from conftest import GPT2_RANKS
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    enc = tiktoken.Encoding("t", pat_str=r50k_pat_str, mergeable_ranks=load_tiktoken_bpe(str(GPT2_RANKS)),
                            special_tokens={})
    return enc.decode([int(i) for i in ids])


def test_transform_batches_and_flushes_every_document():
    # A batch of 3 documents: the tokenizer is called on 2, then on the 1 left; a batch of 1 after it.
    config = TokenizerConfig(spec="jet-nemotron", batch_docs=2)
    encoder = load_encoder("jet-nemotron")
    docs = _docs() + [Document("again", "Hello world", "g", 7)]
    expected = [(d.id, d.source, d.row, encoder.encode_batch([d.text])[0] + [151643]) for d in docs]
    with fnapi_pipeline() as p:
        out = p | beam.Create(doc_batches(docs, with_lid=False)) | TokenizeDocuments(config)
        rows = out | beam.FlatMap(lambda b: [(i, b.source, int(r), t.tolist())
                                             for (i, t, _), r in zip(sequences_of(b), b.rows, strict=True)])
        assert_that(rows, equal_to(expected))
    assert expected[0][3] == [9707, 1879, 151643]


def test_join_with_eos_places_each_id_and_one_eos_after_each_document():
    """Both ways of copying (a slice a document, one mask a call), documents of no ids, calls of no
    documents and a narrower dtype give exactly the ids with an EOS appended after each document."""
    from transforms.bucketed.tokenize import SLICE_COPY_TOKENS, join_with_eos

    rng = np.random.default_rng(7)
    for trial in range(60):
        parts, expected, lengths = [], [], []
        for _ in range(int(rng.integers(0, 5))):
            mean = [3, SLICE_COPY_TOKENS * 4][trial % 2]
            docs = rng.integers(0, 2 * mean, int(rng.integers(0, 6)))
            tokens = rng.integers(0, 50_000, int(docs.sum())).astype(np.uint32)
            parts.append((tokens, np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)))
            at = 0
            for n in docs.tolist():
                expected += [*tokens[at:at + n].tolist(), 50256]
                lengths.append(n + 1)
                at += n
        for dtype in (np.dtype("<u4"), np.dtype("<u2")):
            got_lengths, got = join_with_eos(parts, 50256, dtype)
            assert got.dtype == dtype and got.tolist() == expected
            assert got_lengths.dtype == np.int64 and got_lengths.tolist() == lengths
