"""TokenizeDocuments: ids plus exactly one EOS, in the output dtype, batched."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.testing.util import assert_that, equal_to
from conftest import fnapi_pipeline

from transforms.bucketed.tokenize import TokenizeDocuments, TokenizerConfig, encode_documents
from transforms.core.encoders import load_encoder
from transforms.core.records import Document

TEXTS = {
    "plain": "Hello world",
    "special": "before <|endoftext|> after",
    "accents": "Ação, café, naïve — 東京 🙂",
}


def _docs():
    return [Document(k, v, "f", i) for i, (k, v) in enumerate(TEXTS.items())]


def test_each_document_gets_exactly_one_eos(gpt2_spec):
    encoder = load_encoder(gpt2_spec)
    out = encode_documents(encoder, _docs(), np.dtype("<u2"))
    for tokenized in out:
        assert tokenized.tokens.dtype == np.dtype("<u2")
        assert tokenized.tokens[-1] == 50256
        assert int((tokenized.tokens == 50256).sum()) == 1
        assert encoder_decode(tokenized.tokens[:-1]) == TEXTS[tokenized.id]
    assert out[0].tokens.tolist() == [15496, 995, 50256]


def encoder_decode(ids):
    import tiktoken
    from conftest import GPT2_RANKS
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    enc = tiktoken.Encoding("t", pat_str=r50k_pat_str, mergeable_ranks=load_tiktoken_bpe(str(GPT2_RANKS)),
                            special_tokens={})
    return enc.decode([int(i) for i in ids])


def test_transform_batches_and_flushes_every_document():
    config = TokenizerConfig(spec="jet-nemotron", batch_docs=2)  # 3 docs: one full batch, one flushed at the end
    encoder = load_encoder("jet-nemotron")
    expected = [(d.id, encoder.encode_batch([d.text])[0] + [151643]) for d in _docs()]
    with fnapi_pipeline() as p:
        out = p | beam.Create(_docs()) | TokenizeDocuments(config)
        assert_that(out | beam.Map(lambda t: (t.id, t.tokens.tolist())), equal_to(expected))
    assert expected[0][1] == [9707, 1879, 151643]
