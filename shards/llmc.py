"""The llm.c token file format, used by the scaffold (countdown) job.

    header  256 x little-endian int32: [0] = 20240520 (magic), [1] = 1 (version), [2] = token count
    body    token count x little-endian uint16

Files are ``{split}/shard_NNN.bin`` with split ``train`` or ``val``. Documents follow each other
in the token stream, each ending with EOT; a shard holds exactly ``shard_tokens`` tokens except
the last of a split, so a document may continue in the next shard (as llm.c's own data files do).

Scaffold token ids: GPT-2 BPE 0..50255, EOT 50256, and the countdown token ``<ff_N>`` =
50257 + N for N = 0..999 (ids 50257..51256).

A scaffold output tree (the ``pretokenize scaffold`` job) is

    train/shard_000.bin ...   val/shard_000.bin ...
    checksums.sha256          sha256 of every shard, "HEX  train/shard_000.bin" (sha256sum's format)
    dataset_stats.txt         written last: the commit point

Besides the format this module holds the split hash, where documents go among a split's shards,
the stats file, and ``check_llmc_shard`` / ``check_llmc_split``: the checks of llm.c files a
verifier runs (``shards/scaffold_verify.py`` checks a whole scaffold tree with them).
Nothing here imports Beam.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import fsspec
import numpy as np

from shards import manifest

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")

GPT2_EOT = 50256
FF_BASE = 50257
FF_MAX_N = 999
MAX_TOKEN_ID = FF_BASE + FF_MAX_N  # 51256
SPLITS = ("train", "val")
DEFAULT_SHARD_TOKENS = 100_000_000
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32
MAX_WORDS = FF_MAX_N + 1  # a document counted down with <ff_999> .. <ff_0>
DEFAULT_VAL_FRACTION = 0.05


def ff_token(n: int) -> int:
    """The id of the countdown token <ff_n>."""
    if not 0 <= n <= FF_MAX_N:
        raise ValueError(f"countdown {n} is outside 0..{FF_MAX_N}")
    return FF_BASE + n


def shard_rel_path(split: str, index: int, width: int = 3) -> str:
    """``train/shard_007.bin``. ``width`` (see shard_digits) keeps a split's names sorting in order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return f"{split}/shard_{index:0{width}d}.bin"


def make_header(token_count: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, token_count
    return header.tobytes()


def parse_header(data: bytes, where: str = "shard") -> int:
    """The token count a header declares; a ValueError naming ``where`` if it is not a valid header."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"{where}: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
    if header[0] != MAGIC:
        raise ValueError(f"{where}: magic number is {header[0]}, expected {MAGIC}")
    if header[1] != VERSION:
        raise ValueError(f"{where}: version is {header[1]}, expected {VERSION}")
    if header[2] < 0:
        raise ValueError(f"{where}: negative token count {header[2]}")
    return int(header[2])


def token_count(fs, path: str) -> int:
    """The tokens of the shard ``path`` on the fsspec filesystem ``fs``: its header's count, checked
    against the file's size (a ValueError naming the file when they differ)."""
    with fs.open(path, "rb") as f:
        count = parse_header(f.read(HEADER_BYTES), path)
    body_bytes = fs.size(path) - HEADER_BYTES
    if body_bytes != count * TOKEN_DTYPE.itemsize:
        raise ValueError(f"{path}: header says {count} tokens, the file holds {body_bytes} bytes of tokens")
    return count


# ---------------------------------------------------------------------------------------------
# Where documents go.

_SHARD_NAME_RE = re.compile(r"^shard_(?P<index>[0-9]{3,})\.bin$")


def shard_digits(num_shards: int) -> int:
    """Digits of a split's shard numbers: 3, or more when a split has over 1000 shards, so that
    every name of the split has the same width and a sorted glob lists them in stream order."""
    return max(3, len(str(max(num_shards, 1) - 1)))


def parse_shard_name(name: str) -> int:
    """The index in ``shard_NNN.bin`` (a base name); a ValueError for any other name."""
    m = _SHARD_NAME_RE.match(name)
    if not m:
        raise ValueError(f"not an llm.c shard name: {name!r}")
    return int(m.group("index"))


def shard_lengths(total_tokens: int, shard_tokens: int) -> list[int]:
    """Tokens in each shard of a split holding ``total_tokens``: full shards, the last the rest."""
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be at least 1, got {shard_tokens}")
    full, rest = divmod(total_tokens, shard_tokens)
    return [shard_tokens] * full + ([rest] if rest else [])


def _hash64(text: str, person: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=person).digest(), "little")


def split_of(doc_id: str, val_fraction: float) -> str:
    """``val`` for a stable ``val_fraction`` of ids, else ``train``.

    A BLAKE2b hash of the id alone (its own personalisation, so it does not correlate with the
    shuffle or partition hashes): a document keeps its split on every run, machine and Python,
    and whatever other documents are added or removed.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be within [0, 1), got {val_fraction}")
    # val_fraction * 2**64 is exact in binary floating point, so the threshold is the same everywhere.
    return "val" if _hash64(doc_id, b"llmc-split") < int(val_fraction * 2**64) else "train"


# ---------------------------------------------------------------------------------------------
# dataset_stats.txt of a scaffold tree.

STATS_FORMAT = "llmc-scaffold"
_SEP = " | "
_SPLIT_HEADER = "split | documents | sequences | words | tokens | files"
_DROP_HEADER = "drop_reason | documents"


@dataclasses.dataclass
class SplitStats:
    """One split. ``documents`` counts source documents; ``sequences`` what the shards hold as
    documents (more than ``documents`` when --long-docs chunk cut long ones into pieces)."""

    documents: int = 0
    sequences: int = 0
    words: int = 0
    tokens: int = 0
    files: int = 0


@dataclasses.dataclass
class ScaffoldStats:
    """Everything ``dataset_stats.txt`` of a scaffold tree holds; ``drops`` maps a reason to a count."""

    raw_documents: int
    tokenizer: str
    annotate: bool
    long_docs: str
    max_word_chars: int
    val_fraction: float
    seed: int
    shard_tokens: int
    countdown_mismatches: int
    splits: dict[str, SplitStats]
    drops: dict[str, int]

    @property
    def kept_documents(self) -> int:
        return sum(s.documents for s in self.splits.values())

    @property
    def dropped_documents(self) -> int:
        return sum(self.drops.values())

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.splits.values())

    @property
    def total_files(self) -> int:
        return sum(s.files for s in self.splits.values())

    def to_text(self) -> str:
        settings = [
            ("format", STATS_FORMAT),
            ("raw_documents", self.raw_documents),
            ("tokenizer", self.tokenizer),
            ("eot_id", GPT2_EOT),
            ("ff_base", FF_BASE),
            ("max_words", MAX_WORDS),
            ("annotate", str(self.annotate).lower()),
            ("long_docs", self.long_docs),
            ("max_word_chars", self.max_word_chars),
            ("val_fraction", repr(float(self.val_fraction))),
            ("seed", self.seed),
            ("shard_tokens", self.shard_tokens),
            ("kept_documents", self.kept_documents),
            ("dropped_documents", self.dropped_documents),
            ("total_tokens", self.total_tokens),
            ("total_files", self.total_files),
            ("countdown_mismatch_documents", self.countdown_mismatches),
        ]
        lines = ["# beam-pretokenize scaffold (llm.c) dataset statistics"]
        lines += [f"{k}: {v}" for k, v in settings]
        lines += ["", _SPLIT_HEADER]
        for name in SPLITS:
            s = self.splits.get(name, SplitStats())
            lines.append(_SEP.join(str(v) for v in (name, s.documents, s.sequences, s.words, s.tokens, s.files)))
        lines += ["", _DROP_HEADER]
        lines += [f"{reason}{_SEP}{n}" for reason, n in sorted(self.drops.items())]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> ScaffoldStats:
        settings, (splits, drops) = manifest.parse_stats_text(text, {_SPLIT_HEADER: _split_row,
                                                                     _DROP_HEADER: manifest.drop_row})
        if settings.get("format") != STATS_FORMAT:
            raise ValueError(f"not scaffold dataset stats: format is {settings.get('format')!r}")
        try:
            stats = cls(
                raw_documents=int(settings["raw_documents"]),
                tokenizer=settings["tokenizer"],
                annotate=settings["annotate"] == "true",
                long_docs=settings["long_docs"],
                max_word_chars=int(settings["max_word_chars"]),
                val_fraction=float(settings["val_fraction"]),
                seed=int(settings["seed"]),
                shard_tokens=int(settings["shard_tokens"]),
                countdown_mismatches=int(settings["countdown_mismatch_documents"]),
                splits=splits,
                drops=drops,
            )
        except KeyError as e:
            raise ValueError(f"scaffold dataset stats lack the setting {e.args[0]!r}") from None
        manifest.check_totals(settings, [
            ("kept_documents", stats.kept_documents), ("dropped_documents", stats.dropped_documents),
            ("total_tokens", stats.total_tokens), ("total_files", stats.total_files)])
        return stats


def _split_row(cells: list[str]) -> tuple[str, SplitStats]:
    name, *counts = cells
    return name, SplitStats(*(int(c) for c in counts))


def is_scaffold_stats(text: str) -> bool:
    """Whether a dataset_stats.txt is this format's (the bucketed job writes another)."""
    return f"\nformat: {STATS_FORMAT}\n" in f"\n{text}"


# ---------------------------------------------------------------------------------------------
# Format checks (what `pretokenize verify` runs on a scaffold tree).

CHECK_BLOCK_TOKENS = 1 << 22  # tokens checked at a time: memory stays ~10 bytes a token of this

_PROBLEMS = {
    "id_range": f"token ids above {MAX_TOKEN_ID}",
    "empty_document": "empty documents (an EOT right after an EOT, or at the start of the split)",
    "no_countdown_start": "documents that do not start with a countdown token",
    "countdown_without_word": "countdown tokens not followed by a BPE token (another countdown or an EOT follows)",
    "countdown_step": "countdown tokens that are not one less than the countdown before them",
    "countdown_end": "documents whose last countdown token is not <ff_0>",
}


class _Found:
    __slots__ = ("count", "first")

    def __init__(self):
        self.count = 0
        self.first = ""

    def add(self, n: int, first: str) -> None:
        if n:
            if not self.count:
                self.first = first
            self.count += n


class LlmcStreamChecker:
    """Checks one split's token stream, fed shard by shard in order (documents may span shards).

    ``feed(tokens, where)`` takes consecutive blocks; ``problems()`` ends the stream and lists what
    is wrong, one line per kind of problem with its count and where it first occurs. With
    ``starts_document=False`` the stream may begin inside a document (a shard checked on its own
    that is not its split's first): the checks that need the document's beginning skip it.
    All checks are numpy over the block; the state carried between blocks is two small values.
    """

    # What the token before the block was.
    _START, _UNKNOWN, _EOT, _FF, _WORD = range(5)

    def __init__(self, starts_document: bool = True):
        self._prev = self._START if starts_document else self._UNKNOWN
        self._open_ff: int | None = None  # the last countdown value of the document still open
        self._found = {k: _Found() for k in _PROBLEMS}
        self._last_where = "the stream"
        self.tokens = 0
        self.documents = 0

    def _mask(self, kind: str, mask: np.ndarray, where: str, pos0: int) -> None:
        n = int(np.count_nonzero(mask))
        if n:
            self._found[kind].add(n, f"{where} token {pos0 + int(np.argmax(mask))}")

    def feed(self, tokens: np.ndarray, where: str, pos0: int = 0) -> None:
        """Check the next ``tokens`` of the stream; ``where`` (a shard name) and ``pos0`` (the index
        of tokens[0] in that shard) locate the problems."""
        t = np.asarray(tokens)
        m = len(t)
        if m == 0:
            return
        self._last_where = where
        self.tokens += m
        is_eot = t == GPT2_EOT
        is_ff = (t >= FF_BASE) & (t <= MAX_TOKEN_ID)
        is_word = ~is_eot & ~is_ff  # BPE ids (ids out of range are reported on their own)
        self._mask("id_range", t > MAX_TOKEN_ID, where, pos0)

        # A document starts at the stream's start and after every EOT.
        starts = np.empty(m, dtype=bool)
        starts[0] = self._prev in (self._START, self._EOT)
        starts[1:] = is_eot[:-1]
        self._mask("empty_document", starts & is_eot, where, pos0)
        self._mask("no_countdown_start", starts & is_word, where, pos0)

        after_ff = np.empty(m, dtype=bool)
        after_ff[0] = self._prev == self._FF
        after_ff[1:] = is_ff[:-1]
        self._mask("countdown_without_word", after_ff & ~is_word, where, pos0)
        self._check_countdowns(t, is_eot, is_ff, where, pos0)
        self._prev = self._EOT if is_eot[-1] else self._FF if is_ff[-1] else self._WORD

    def _check_countdowns(self, t: np.ndarray, is_eot: np.ndarray, is_ff: np.ndarray, where: str, pos0: int) -> None:
        """Each document's countdown steps down by one and ends at <ff_0>, across blocks."""
        # Countdown values, each with its document: 0 is the one open when the block starts, k the
        # one after the block's k-th EOT. The open document's last value leads as a carried entry.
        eot_pos = np.flatnonzero(is_eot)
        n_eot = len(eot_pos)
        self.documents += n_eot
        doc_of = np.cumsum(is_eot) - is_eot
        pos = np.flatnonzero(is_ff)
        values = t[pos].astype(np.int64) - FF_BASE
        docs = doc_of[pos]
        if self._open_ff is not None:
            values = np.concatenate(([self._open_ff], values))
            docs = np.concatenate(([0], docs))
            pos = np.concatenate(([-1], pos))
        if len(values):
            same_doc = docs[1:] == docs[:-1]
            bad_step = same_doc & (values[1:] != values[:-1] - 1)
            if bad_step.any():
                first = int(pos[1:][np.argmax(bad_step)])
                self._found["countdown_step"].add(int(np.count_nonzero(bad_step)), f"{where} token {pos0 + first}")
            last_of_doc = np.ones(len(values), dtype=bool)
            last_of_doc[:-1] = ~same_doc
            bad_end = last_of_doc & (docs < n_eot) & (values != 0)
            if bad_end.any():
                first = int(eot_pos[docs[np.argmax(bad_end)]])
                self._found["countdown_end"].add(int(np.count_nonzero(bad_end)), f"{where} token {pos0 + first}")
            still_open = docs == n_eot
            self._open_ff = int(values[still_open][-1]) if still_open.any() else None

    def problems(self, ends_document: bool = True) -> list[str]:
        """Ends the stream: the problems found, one line per kind. With ``ends_document`` the
        stream must end with EOT (it is a whole split, or a split's last shard)."""
        if ends_document and self._prev == self._FF:
            self._found["countdown_without_word"].add(1, f"{self._last_where}, its last token")
        out = [f"{f.count} {_PROBLEMS[k]} (first at {f.first})" for k, f in self._found.items() if f.count]
        if ends_document and self._prev in (self._FF, self._WORD):
            out.append(f"the last document does not end with EOT {GPT2_EOT} ({self._last_where} ends inside it)")
        return out


def _source_name(source) -> str:
    return "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)


def _open_source(source):
    """A binary file object for a local path, an fsspec URL or the file's bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(source))
    path = os.fspath(source)
    if "://" in path:
        return fsspec.open(path, "rb").open()
    return open(path, "rb")


class ShardRead(NamedTuple):
    problems: list[str]  # of the header and the size
    count: int  # the header's token count; -1 when the header is unreadable (the body is not checked)
    sha256: str  # of the whole file, header included


def _feed_shard(source, checker: LlmcStreamChecker, where: str, block_tokens: int) -> ShardRead:
    """One shard's header checked and its body fed to ``checker``, the file hashed on the way."""
    digest = hashlib.sha256()
    with _open_source(source) as f:
        header = f.read(HEADER_BYTES)
        digest.update(header)
        try:
            count = parse_header(header, where)
        except ValueError as e:
            while data := f.read(block_tokens * TOKEN_DTYPE.itemsize):
                digest.update(data)
            return ShardRead([str(e)], -1, digest.hexdigest())
        body = 0
        tail = b""
        while data := f.read(block_tokens * TOKEN_DTYPE.itemsize):
            digest.update(data)
            data = tail + data
            usable = len(data) - len(data) % TOKEN_DTYPE.itemsize
            tail = data[usable:]
            checker.feed(np.frombuffer(data[:usable], dtype=TOKEN_DTYPE), where, body // TOKEN_DTYPE.itemsize)
            body += usable
        body += len(tail)
    if body != count * TOKEN_DTYPE.itemsize:
        return ShardRead([f"{where}: the header says {count} tokens, the file holds {body} bytes of tokens"], count,
                         digest.hexdigest())
    return ShardRead([], count, digest.hexdigest())


def check_llmc_shard(
    source,
    *,
    name: str | None = None,
    starts_document: bool = True,
    ends_document: bool = True,
    block_tokens: int = CHECK_BLOCK_TOKENS,
) -> list[str]:
    """The problems of one llm.c scaffold shard, as lines naming the shard; empty when it is sound.

    ``source`` is a local path, an fsspec URL or the file's bytes; ``name`` names it in messages.
    Checked: the header (magic, version, count) against the file's size; every id at most 51256;
    each document starts with a countdown token, each countdown token is followed by at least one
    BPE token, the countdown falls by one to <ff_0>, each document ends with EOT. A shard that is
    not its split's first may begin inside a document (pass ``starts_document=False``) and one
    that is not its split's last may end inside one (``ends_document=False``); check_llmc_split
    checks a whole split, across those boundaries.
    """
    where = name or _source_name(source)
    checker = LlmcStreamChecker(starts_document)
    problems = _feed_shard(source, checker, where, block_tokens).problems
    return problems + [f"{where}: {p}" for p in checker.problems(ends_document)]


class SplitScan(NamedTuple):
    problems: list[str]
    files: int
    tokens: int  # as the headers declare
    documents: int  # EOT tokens found
    sha256: tuple[str, ...] = ()  # of each file, in order


def scan_llmc_split(
    sources: Sequence,
    *,
    names: Sequence[str] | None = None,
    shard_tokens: int | None = None,
    block_tokens: int = CHECK_BLOCK_TOKENS,
) -> SplitScan:
    """check_llmc_split's problems, with the split's file, token and document counts and each
    file's sha256 (computed as the file is read for the checks: no second pass)."""
    names = [_source_name(s) for s in sources] if names is None else list(names)
    if len(names) != len(sources):
        raise ValueError("names and sources differ in length")
    problems: list[str] = []
    for i, name in enumerate(names):
        try:
            index = parse_shard_name(posixpath.basename(name.replace(os.sep, "/")))
        except ValueError as e:
            problems.append(str(e))
            continue
        if index != i:
            problems.append(f"{name}: is shard {index}, expected shard {i} here (numbered 0, 1, ... without gaps)")
    checker = LlmcStreamChecker(starts_document=True)
    counts, digests = [], []
    for source, name in zip(sources, names, strict=True):
        read = _feed_shard(source, checker, name, block_tokens)
        problems += read.problems
        counts.append(read.count)
        digests.append(read.sha256)
    label = (posixpath.dirname(names[0].replace(os.sep, "/")) if names else "") or "split"
    problems += [f"{label}: {p}" for p in checker.problems(ends_document=True)]
    if counts and min(counts) >= 0:
        full = shard_tokens if shard_tokens is not None else counts[0]
        for name, count in zip(names[:-1], counts[:-1], strict=True):
            if count != full:
                problems.append(f"{name}: holds {count} tokens; every shard but the last must hold {full}")
        if counts[-1] > full:
            problems.append(f"{names[-1]}: the last shard holds {counts[-1]} tokens, more than a full shard ({full})")
    return SplitScan(problems, len(sources), sum(c for c in counts if c > 0), checker.documents, tuple(digests))


def check_llmc_split(
    sources: Sequence,
    *,
    names: Sequence[str] | None = None,
    shard_tokens: int | None = None,
    block_tokens: int = CHECK_BLOCK_TOKENS,
) -> list[str]:
    """The problems of one split's shards, given in order (shard_000, shard_001, ...).

    Everything check_llmc_shard checks, carried across shard boundaries (a document may continue
    in the next shard), plus: the names number the shards 0, 1, 2, ... without a gap; every shard
    but the last holds the same count (``shard_tokens`` when given) and the last no more.
    """
    return scan_llmc_split(sources, names=names, shard_tokens=shard_tokens, block_tokens=block_tokens).problems


def sorted_shard_files(paths: Iterable[str]) -> list[str]:
    """The ``shard_NNN.bin`` paths among ``paths``, in shard order; other names are left out."""
    named = []
    for path in paths:
        try:
            named.append((parse_shard_name(posixpath.basename(path)), path))
        except ValueError:
            continue
    return [p for _, p in sorted(named)]
