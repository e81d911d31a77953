"""Compressed input: a file's bytes decompressed as its suffix says (``.gz``, ``.zst``, ``.bz2``,
``.xz``), and a clear error for data that cannot be decompressed.

A file that cannot be decompressed (truncated, or not in the format its suffix says) stops the job
with a BadInputError naming it, whatever ``on_bad_record`` says: its records cannot be told apart
from the damage. An empty file is empty whatever its suffix.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zlib
from collections.abc import Iterator
from typing import BinaryIO

import zstandard

from shards import storage
from transforms.core.records import BadInputError

# Compression suffix -> its name in messages ("" for none).
COMPRESSIONS = {"": "", ".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}


class ZstdReader(io.RawIOBase):
    """The bytes of zstd frames one after another, and an EOFError when the data ends inside a frame.

    zstandard's own stream_reader returns what it has when its input ends mid-frame, and stops at
    the end of the first frame: a truncated file, or one of several frames (pzstd, ``cat a.zst
    b.zst``), would read as a shorter file without a word.
    """

    def __init__(self, raw: BinaryIO, chunk_bytes: int = 1 << 16):
        self._raw = raw
        self._chunk = chunk_bytes
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = None  # the decompressor of the frame being read; None between frames
        self._out = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._pos == len(self._out):
            data = self._raw.read(self._chunk)
            if not data:
                if self._frame is not None:
                    raise EOFError("the zstd data ends inside a frame")
                return 0
            self._out, self._pos = self._decompress(data), 0
        n = min(len(buffer), len(self._out) - self._pos)
        buffer[:n] = self._out[self._pos:self._pos + n]
        self._pos += n
        return n

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            out.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            data, self._frame = self._frame.unused_data, None
        return b"".join(out)


# Compression name -> a binary file of the decompressed bytes of a binary file.
DECOMPRESSORS = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "zstd": lambda raw: io.BufferedReader(ZstdReader(raw), buffer_size=1 << 16),
    "bz2": lambda raw: bz2.BZ2File(raw, mode="rb"),
    "xz": lambda raw: lzma.LZMAFile(raw, mode="rb"),
}


def compression_of(path: str) -> str:
    """The name of the compression ``path``'s suffix says ("" for none)."""
    lower = path.lower()
    return next((name for ext, name in COMPRESSIONS.items() if ext and lower.endswith(ext)), "")


def _is_decompression_error(error: Exception) -> bool:
    """Whether a decompressor rejected its data. An OSError that carries an errno is the system's
    (a disk, a network): it is left as it is, for the runner to retry. Others (gzip's BadGzipFile,
    bz2's "Invalid data stream") are about the data."""
    if isinstance(error, (EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)):
        return True
    return isinstance(error, OSError) and error.errno is None


class StoredPosition:
    """How far into a file as it is stored (its compressed bytes, for a compressed file) a reader
    of open_decompressed has come: ``bytes``, asked of the open file (a decompressor reads ahead of
    what it has given, by a buffer), then where it was when the file closed."""

    def __init__(self) -> None:
        self._raw = None
        self._last = 0

    @property
    def bytes(self) -> int:
        self._note()
        return self._last

    @contextlib.contextmanager
    def following(self, raw) -> Iterator[None]:
        """Follows ``raw`` while it is open."""
        self._raw = raw
        try:
            yield
        finally:
            self._note()
            self._raw = None

    def _note(self) -> None:
        if self._raw is not None:
            with contextlib.suppress(OSError, ValueError):  # a file that cannot say: where it last was
                self._last = self._raw.tell()


@contextlib.contextmanager
def open_decompressed(path: str, position: StoredPosition | None = None) -> Iterator[BinaryIO]:
    """The bytes of an input file, decompressed as its suffix says; ``position`` follows how far
    into the file as stored they have been read (a unit's progress: transforms.inputs.read).

    Data that cannot be decompressed (a truncated file, a file not in its suffix's format) raises
    a BadInputError naming the file. It has no reason: a damaged file is not a record to skip.
    An empty file is empty whatever its suffix (bz2 and xz would call it truncated, gzip and zstd
    would not), as a parquet file without rows adds nothing.
    """
    fs, fs_path = storage.filesystem(path)
    compression = compression_of(path)
    with fs.open(fs_path, "rb") as raw, (position or StoredPosition()).following(raw):
        empty = not raw.read(1)
        raw.seek(0)
        if empty or not compression:
            yield raw
            return
        try:
            with DECOMPRESSORS[compression](raw) as f:
                yield f
        except Exception as e:
            if not _is_decompression_error(e):
                raise
            if isinstance(e, EOFError):
                problem = f"is truncated (its {compression} data ends before the end-of-stream marker)"
            else:
                problem = f"is not valid {compression} data ({e})"
            raise BadInputError(path, problem) from None
