"""The tokenizers: a spec (shards/tokenizer_spec.py) loaded into an Encoder, one concern per module.

    load.py              load_encoder (spec, backend, special-token mode -> Encoder), check_unchanged
    encoder.py           Encoder (what the jobs call) and BpeVocabulary (what a backend builds it from)
    backends.py          the backend registry (--tokenizer-backend), resolve_backend, other_backend
    tiktoken_backend.py  the reference backend
    quicktok_backend.py  quicktok, for Qwen2's pattern (jet-nemotron)
    hf.py                hf:NAME_OR_PATH, Hugging Face's own tokenizer
    trained.py           trained:DIR, a directory train-bpe wrote, used only whole
    ranks.py             tiktoken ranks files, the packaged ones
    vocabularies.py      patterns, EOS ids and added tokens of the Qwen2.5 and GPT-2 vocabularies
    long_text.py         LongTextSplitter: long texts encoded in pieces that give the ids of the whole
    added_tokens.py      --special-tokens tokenizer: added-token strings given their ids, as HF does
    probe.py             the probe a backend must pass against the reference to load
    cache.py             EncoderCache: encoders built from local files, by the files' identity

Every backend encodes text without special tokens by default: a literal ``<|endoftext|>`` inside a
document is text, never the EOS id. docs/tokenizers.md says what each spec and backend means to a user.
"""
