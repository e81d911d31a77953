"""Learning a BPE tokenizer from a corpus: pre-tokenization, the merge learner, the tokenizer files."""
