"""Two ranks of a tiktoken ranks file swapped: a tokenizer that gives other ids, of the same size."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from transforms.run.resume import PROBE_TEXT
from transforms.tokenizers.load import load_encoder


def swap_ranks(path: Path, a: int, b: int) -> None:
    """Swap ranks ``a`` and ``b`` in the ranks file ``path``, written whole under a new name then
    renamed (as an editor or a re-training would)."""
    lines = path.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if line.strip():
            token, rank = line.split()
            if int(rank) in (a, b):
                lines[i] = token + b" " + str(b if int(rank) == a else a).encode()
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(b"\n".join(lines))
    os.replace(tmp, path)


def unseen_by_the_probe(ranks: Path, texts: list[str]) -> tuple[int, int]:
    """Two ranks frequent in ``texts`` whose swap leaves the resume probe's ids as they were: only
    the files tell the tokenizers apart."""
    encoder = load_encoder(f"tiktoken:{ranks}")
    probe = set(encoder.encode_batch([PROBE_TEXT])[0])
    counts = Counter(t for ids in encoder.encode_batch(texts) for t in ids if t not in probe and t >= 256)
    frequent = [t for t, _ in counts.most_common(2)]
    assert len(frequent) == 2, "the texts hold too few tokens"
    return frequent[0], frequent[1]
