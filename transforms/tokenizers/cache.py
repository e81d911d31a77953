"""EncoderCache: encoders built from local files, kept by the files' identity.

A launcher and an in-process worker (the FnApiRunner's default) then build one encoder, not two. The
process's cache is load.ENCODERS; ``load_encoder(..., cache=None)`` builds afresh, which is how a test
gets an encoder of its own without resetting anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from transforms.tokenizers.encoder import Encoder


class EncoderCache:
    """At most ``size`` encoders, by (key, the file's absolute path, inode, size and mtime): a
    replaced file gets a new entry; the oldest entry goes first."""

    def __init__(self, size: int = 4):
        self.size = size
        self._entries: dict[tuple, Encoder] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, path: str, build: Callable[[], Encoder]) -> Encoder:
        """The encoder built for ``key`` from the file at ``path`` as it is now, built if there is none;
        a path that is not a local file (an fsspec URL) is built every time."""
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return build()
        entry = (key, os.path.abspath(path), st.st_ino, st.st_size, st.st_mtime_ns)
        if entry not in self._entries:
            while len(self._entries) >= self.size:
                self._entries.pop(next(iter(self._entries)))
            self._entries[entry] = build()
        return self._entries[entry]

    @staticmethod
    def through(cache: EncoderCache | None, key: str, path: str, build: Callable[[], Encoder]) -> Encoder:
        """``cache.get(...)``, or ``build()`` when there is no cache."""
        return build() if cache is None else cache.get(key, path, build)
