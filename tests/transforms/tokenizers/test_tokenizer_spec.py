"""The tokenizer spec parsed in one place (shards/tokenizer_spec.py), and what every consumer makes of it:
the loader, the launch's provenance, the card's decode snippet, decode; the ``qwen2.5`` alias with them."""

from __future__ import annotations

import hashlib

import pytest

from pipelines import cli
from pipelines.decode import load_token_bytes
from shards.card import _decode_snippet
from shards.tokenizer_spec import KINDS, TokenizerSpec, parse_spec
from transforms.run.provenance import tokenizer_files
from transforms.tokenizers.added_tokens import added_tokens
from transforms.tokenizers.backends import BACKENDS, REGISTRY, resolve_backend
from transforms.tokenizers.cache import EncoderCache
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.ranks import gpt2_ranks_path, qwen_ranks_path

TEXTS = ["Hello, world!", "Zürich — naïve café 日本語 <|endoftext|> 1234", "a  b\r\n\tc"]


@pytest.mark.parametrize(
    ("text", "kind", "arg", "packaged"),
    [
        ("jet-nemotron", "jet-nemotron", "", True),
        ("jet-nemotron:/r/qwen.tiktoken", "jet-nemotron", "/r/qwen.tiktoken", False),
        ("qwen2.5", "jet-nemotron", "", True),
        ("qwen2.5:s3://b/qwen.tiktoken", "jet-nemotron", "s3://b/qwen.tiktoken", False),
        ("gpt2", "gpt2", "", True),
        ("tiktoken:a:b.tiktoken", "tiktoken", "a:b.tiktoken", False),  # only the first colon separates
        ("hf:Qwen/Qwen2.5-0.5B", "hf", "Qwen/Qwen2.5-0.5B", False),
        ("trained:out/tok", "trained", "out/tok", False),
    ],
)
def test_a_spec_is_parsed_into_its_kind_and_argument(text, kind, arg, packaged):
    spec = parse_spec(text)
    assert (spec.kind, spec.arg, spec.packaged, spec.text, str(spec)) == (kind, arg, packaged, text, text)
    assert parse_spec(spec) is spec  # a parsed spec passes through
    assert spec.fixed_eos == (kind not in ("hf", "trained"))


@pytest.mark.parametrize(
    "text", ["sentencepiece:foo.model", "gpt2:extra", "tiktoken", "hf:", "trained:", "", "QWEN2.5"]
)
def test_anything_else_is_refused_with_every_kind_listed(text):
    with pytest.raises(ValueError) as e:
        parse_spec(text)
    assert str(e.value) == (f"unknown tokenizer {text!r}; use jet-nemotron, jet-nemotron:RANKS, gpt2, "
                            "tiktoken:RANKS, hf:NAME_OR_PATH or trained:DIR")


@pytest.mark.parametrize("text, meant", [("gtp2", "gpt2"), ("jetnemotron", "jet-nemotron"),
                                         ("qwen2", "qwen2.5"), ("tiktokn:r.tiktoken", "tiktoken")])
def test_a_typo_of_a_name_says_the_name_meant(text, meant):
    with pytest.raises(ValueError) as e:
        parse_spec(text)
    assert str(e.value).startswith(f"unknown tokenizer {text!r} (did you mean {meant}?); use jet-nemotron, ")


def test_the_where_of_a_spec_is_its_url_or_itself():
    assert parse_spec("tiktoken:s3://b/r.tiktoken").where == "s3://b/r.tiktoken"
    assert parse_spec("tiktoken:/tmp/r.tiktoken").where == "tiktoken:/tmp/r.tiktoken"
    assert TokenizerSpec("gpt2", "gpt2") == parse_spec("gpt2")


def test_qwen25_is_jet_nemotron_to_every_consumer():
    alias, jet = load_encoder("qwen2.5"), load_encoder("jet-nemotron")
    assert alias.spec == "qwen2.5"  # recorded as typed
    assert alias.encode_batch(TEXTS) == jet.encode_batch(TEXTS)
    assert (alias.eos_id, alias.vocab_size, alias.files) == (jet.eos_id, jet.vocab_size, jet.files)
    assert resolve_backend("qwen2.5", "auto") == resolve_backend("jet-nemotron", "auto")
    assert added_tokens(parse_spec("qwen2.5"), alias.eos_id) == added_tokens(parse_spec("jet-nemotron"), jet.eos_id)
    with open(qwen_ranks_path(), "rb") as f:
        assert tokenizer_files("qwen2.5") == [("qwen.tiktoken", hashlib.sha256(f.read()).hexdigest())]
    assert _decode_snippet("qwen2.5") == _decode_snippet("jet-nemotron")
    tokenized = load_encoder("qwen2.5", special_tokens="tokenizer").encode_batch(["a<|im_start|>b"])
    assert tokenized == load_encoder("jet-nemotron", special_tokens="tokenizer").encode_batch(["a<|im_start|>b"])


def test_the_card_snippet_follows_the_kind():
    assert "tiktoken.get_encoding(\"gpt2\")" in "\n".join(_decode_snippet("gpt2"))
    assert "AutoTokenizer.from_pretrained('some/tok')" in "\n".join(_decode_snippet("hf:some/tok"))
    for text in ("qwen2.5:/r/qwen.tiktoken", "tiktoken:/r/gpt2.tiktoken", "trained:out/tok", "not-a-spec"):
        assert _decode_snippet(text)[0].startswith(f"Decode the ids with the tokenizer `{text}` names")


def test_decode_reads_gpt2_ranks_for_both_spellings():
    by_name, by_path = load_token_bytes("gpt2"), load_token_bytes(f"tiktoken:{gpt2_ranks_path()}")
    assert by_name([15496, 11, 995]) == by_path([15496, 11, 995]) == b"Hello, world"
    with pytest.raises(ValueError, match="decode needs a GPT-2 tokenizer"):
        load_token_bytes("qwen2.5")


def test_an_encoder_cache_is_passed_not_reset(tmp_path):
    ranks = tmp_path / "r.tiktoken"
    ranks.write_bytes(open(gpt2_ranks_path(), "rb").read())
    cache = EncoderCache(size=1)
    first = load_encoder(f"tiktoken:{ranks}", cache=cache)
    assert load_encoder(f"tiktoken:{ranks}", cache=cache) is first and len(cache) == 1
    assert load_encoder(f"tiktoken:{ranks}", cache=None) is not first  # None: built afresh
    assert load_encoder("gpt2", cache=cache) is not first and len(cache) == 1  # the oldest goes


def test_every_backend_of_the_registry_is_a_flag_choice():
    assert BACKENDS == ("auto", *sorted(REGISTRY)) and "tiktoken" in REGISTRY
    assert set(KINDS) == {"jet-nemotron", "gpt2", "tiktoken", "hf", "trained"}


def test_the_cli_refuses_an_unknown_spec_in_one_line(tmp_path, capsys):
    code = cli.main(["bucketed", "--input", "tests/data/finepdfs_sample.parquet", "--output", str(tmp_path / "out"),
                     "--tokenizer", "qwen3", "--runner=FnApiRunner"])
    assert code == 2 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown tokenizer 'qwen3'" in err[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "fast"}, "--tokenizer-backend must be one of auto, quicktok, tiktoken, got 'fast'"),
        ({"threads": 0}, "--tokenizer-threads must be at least 1, got 0"),
        ({"special_tokens": "ids"}, "--special-tokens must be one of text, tokenizer, got 'ids'"),
    ],
)
def test_the_options_are_checked_in_one_place(options, message):
    from transforms.bucketed.tokenize import TokenizerConfig

    with pytest.raises(ValueError) as by_config:
        TokenizerConfig("gpt2", **options)
    with pytest.raises(ValueError) as by_loader:
        load_encoder("gpt2", **options, cache=None)
    assert str(by_config.value) == str(by_loader.value) == message
