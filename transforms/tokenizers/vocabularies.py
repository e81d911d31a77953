"""The fixed facts of the vocabularies the tokenizers are built on: patterns, EOS ids, added tokens."""

from __future__ import annotations

ENDOFTEXT = "<|endoftext|>"

# The pre-tokenization regex of the Qwen2 / Qwen2.5 tokenizer (tokenizer.json, Split pre-tokenizer).
# Unlike GPT-4's cl100k pattern it takes digits one at a time (\p{N}, not \p{N}{1,3}).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# GPT-2's pre-tokenization regex as GPT-2 published it; tiktoken's r50k_pat_str is an equivalent
# rewrite (possessive quantifiers), and HF's ByteLevel(use_regex=True) applies the same split.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GPT-2's <|endoftext|>, numbered right after its 50,256 ranks.
GPT2_EOS = 50256
# Qwen2.5 numbers its special tokens from here; <|endoftext|> is the first.
QWEN2_SPECIAL_START = 151643
# The embedding size of Jet-Nemotron-2B (and Qwen2.5): ids run below this.
JET_NEMOTRON_VOCAB_SIZE = 151936
# Qwen2.5's added tokens (tokenizer.json added_tokens), ids 151643..151664 in this order; every one with
# lstrip, rstrip, single_word and normalized false. <tool_call> and after are not "special" there, which
# only matters to skip_special_tokens when decoding: encoding matches every added token alike.
QWEN25_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
