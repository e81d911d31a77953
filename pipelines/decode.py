"""``pretokenize decode``: print the documents of a bucketed tree, or of llm.c scaffold shards, back as text.

    pretokenize decode out/sample --docs 3              # a bucketed tree: its first 3 documents
    pretokenize decode out/sample --id '<urn:uuid:...>' # one document, by its original id
    pretokenize decode out/scaffold/train/shard_000.bin --docs 3 [--markers] [--tokenizer gpt2]
    pretokenize decode out/scaffold/val                 # every shard of a split, in order

A bucketed tree (a directory with ``processed_spec.txt``; only a finished one, with its
``dataset_stats.txt``, is read) is read through shards.reader in storage order (bucket, partition,
file, as the manifest lists them), each document where the manifest says it is. It is decoded with
the tokenizer its ``dataset_stats.txt`` names (the bundled jet-nemotron / qwen2.5 and gpt2 ranks:
offline), or with ``--tokenizer``; each document is printed after a ``==> ID <==`` line, its final
EOS left out (an EOS inside it, in a tree written with ``--special-tokens tokenizer``, is printed as
the EOS's text).

llm.c scaffold shards:

Each document is split into words at its countdown tokens; each word's BPE ids are decoded on
their own, and the words are joined with single spaces (the dataset card's "How to Decode").
``--markers`` puts each word's ``<ff_N>`` before it, which gives the ``content-ff`` form back.
Documents are separated by a blank line.

A document may continue from one shard into the next. Shards given one after another in their
order are read as one stream (the reader's: shards.reading.store.TokenStore over the files, each header
checked against its file's size); a document still open at the end of the last one given is read
on into the shards beside it. A stream that begins inside a document (the shard before it, beside
it, does not end with EOT) has the tokens up to that document's EOT skipped, with a note on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import posixpath
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, TextIO

import numpy as np

from pipelines.flags import add_setting_flags, parse_plain_settings
from pipelines.help_format import DefaultsHelpFormatter
from shards import layout, llmc, storage
from shards.reading.opening import open_tree
from shards.reading.shard_tree import ShardTree
from shards.reading.store import TokenStore
from shards.tokenizer_spec import parse_spec
from transforms.core.records import BadInputError, UsageError
from transforms.core.settings import REQUIRED, setting
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.ranks import gpt2_ranks_path, load_ranks

# Tokens read at a time from a stream: memory stays small, and --docs N reads little more than N documents.
_BLOCK_TOKENS = 1 << 20


def load_token_bytes(spec: str) -> Callable[[Sequence[int]], bytes]:
    """The bytes of BPE ids for a tokenizer spec: gpt2, tiktoken:PATH or hf:NAME_OR_PATH."""
    try:
        parsed = parse_spec(spec)
    except ValueError:
        parsed = None
    if parsed is not None and parsed.kind in ("gpt2", "tiktoken"):
        ranks = load_ranks(gpt2_ranks_path() if parsed.packaged else parsed.arg)  # packaged: offline
        table = [b""] * len(ranks)
        for token, rank in ranks.items():
            table[rank] = token
        return lambda ids: b"".join(table[i] for i in ids)
    if parsed is not None and parsed.kind == "hf":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(parsed.arg)
        return lambda ids: tok.decode(list(ids), clean_up_tokenization_spaces=False).encode("utf-8")
    raise ValueError(f"decode needs a GPT-2 tokenizer: gpt2, tiktoken:PATH or hf:NAME_OR_PATH, not {spec!r}")


class Word(NamedTuple):
    countdown: int | None  # None for BPE ids not preceded by a countdown token
    ids: np.ndarray


def document_words(tokens: np.ndarray) -> list[Word]:
    """A document's words: each countdown token with the BPE ids up to the next one (EOT left out)."""
    t = np.asarray(tokens)
    if len(t) and t[-1] == llmc.GPT2_EOT:
        t = t[:-1]
    ff = np.flatnonzero(t >= llmc.FF_BASE)
    words = []
    if len(t) and (not len(ff) or ff[0] > 0):
        words.append(Word(None, t[: ff[0] if len(ff) else len(t)]))
    bounds = np.append(ff, len(t))
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        words.append(Word(int(t[start]) - llmc.FF_BASE, t[start + 1:end]))
    return words


def render(tokens: np.ndarray, token_bytes: Callable[[Sequence[int]], bytes], markers: bool) -> str:
    """A document as text: its words joined by spaces, each after its ``<ff_N>`` with ``markers``."""
    parts = []
    for word in document_words(tokens):
        text = token_bytes(word.ids.tolist()).decode("utf-8", errors="replace")
        parts.append(f"<ff_{word.countdown}> {text}" if markers and word.countdown is not None else text)
    return " ".join(parts)


class ScaffoldShard(NamedTuple):
    path: str
    index: int  # -1 when the name is not shard_NNN.bin
    width: int


def _scaffold_shard(path: str) -> ScaffoldShard:
    name = posixpath.basename(path.replace(os.sep, "/"))
    try:
        index = llmc.parse_shard_name(name)
    except ValueError:
        return ScaffoldShard(path, -1, 0)
    return ScaffoldShard(path, index, len(name) - len("shard_.bin"))


def _beside(f: ScaffoldShard, index: int) -> str | None:
    """The path of shard ``index`` in the directory of ``f`` (same number width), if it exists."""
    if f.index < 0 or index < 0:
        return None
    fs, path = storage.filesystem(storage.normalize(f.path))
    other = posixpath.join(posixpath.dirname(path), f"shard_{index:0{f.width}d}.bin")
    return storage.unstrip(fs, other, storage.normalize(f.path)) if fs.exists(other) else None


def shard_stream(paths: Sequence[str]) -> TokenStore:
    """Shard files of one filesystem laid end to end, as the reader reads an llm.c split: local
    files memory-mapped, others read by byte range; each header's count checked against its file."""
    fs, _ = storage.filesystem(storage.normalize(paths[0]))
    inner = [storage.filesystem(storage.normalize(p))[1] for p in paths]
    counts = [llmc.token_count(fs, p) for p in inner]
    return TokenStore(fs, "", inner, counts, llmc.TOKEN_DTYPE, header_bytes=llmc.HEADER_BYTES)


def _blocks(stream: TokenStore, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(position, tokens) of the stream from ``start``, a block at a time."""
    for a in range(start, stream.total, _BLOCK_TOKENS):
        yield a, stream.read(a, min(a + _BLOCK_TOKENS, stream.total))


def _first_eot(stream: TokenStore) -> int | None:
    """The position of the stream's first EOT, None when it has none."""
    for a, block in _blocks(stream):
        ends = np.flatnonzero(block == llmc.GPT2_EOT)
        if len(ends):
            return a + int(ends[0])
    return None


def expand_paths(paths: Sequence[str]) -> list[str]:
    """Shard files from files and split directories (a directory: its shard_NNN.bin in order)."""
    out = []
    for path in paths:
        url = storage.normalize(path)
        fs, p = storage.filesystem(url)
        with storage.reaching(url):
            if fs.isdir(p):
                found = llmc.sorted_shard_files(fs.ls(p, detail=False))
                if not found:
                    raise BadInputError(path, "is a directory without shard_NNN.bin files")
                out += [storage.unstrip(fs, f, url) for f in found]
            elif fs.exists(p):
                out.append(url)
            else:
                raise BadInputError(path, "no such file or directory")
    return out


def _starts_inside_document(f: ScaffoldShard, stream: TokenStore) -> bool:
    """Whether ``stream``, which begins with the shard ``f``, begins inside a document."""
    if f.index == 0:
        return False
    before = _beside(f, f.index - 1)
    if before is not None:
        last = shard_stream([before])
        return last.total > 0 and int(last.read(last.total - 1, last.total)[0]) != llmc.GPT2_EOT
    # Unknown: a stream that opens with a countdown token is taken to open a document.
    first = stream.read(0, min(1, stream.total))
    return len(first) > 0 and first[0] < llmc.FF_BASE and first[0] != llmc.GPT2_EOT


def _runs(files: Sequence[ScaffoldShard]) -> list[list[ScaffoldShard]]:
    """The files in runs of consecutive shards of one directory: each run is one stream."""
    runs: list[list[ScaffoldShard]] = []
    for f in files:
        previous = runs[-1][-1] if runs else None
        if previous is not None and previous.index >= 0 and f.index == previous.index + 1 and (
                posixpath.dirname(previous.path) == posixpath.dirname(f.path)):
            runs[-1].append(f)
        else:
            runs.append([f])
    return runs


def iter_documents(paths: Sequence[str], log: TextIO = sys.stderr) -> Iterator[np.ndarray]:
    """The documents of shard files read as streams (see the module docstring), EOT included."""
    runs = _runs([_scaffold_shard(p) for p in expand_paths(paths)])
    pending: list[np.ndarray] = []
    for k, run in enumerate(runs):
        if pending:
            print(f"note: the document at the end of {runs[k - 1][-1].path} continues beyond it", file=log)
            yield np.concatenate(pending)
            pending = []
        stream = shard_stream([f.path for f in run])
        start = 0
        if _starts_inside_document(run[0], stream):
            eot = _first_eot(stream)
            start = stream.total if eot is None else eot + 1
            print(f"note: skipped {start} tokens at the start of {run[0].path} that finish a document "
                  "begun in the shard before it", file=log)
        for _, block in _blocks(stream, start):
            yield from _split(block, pending)
    # A document still open: read on into the next shards beside the last one.
    last = runs[-1][-1] if runs else None
    while pending:
        nxt = _beside(last, last.index + 1)
        if nxt is None:
            print(f"note: the last document of {last.path} does not end with EOT", file=log)
            yield np.concatenate(pending)
            return
        last = _scaffold_shard(nxt)
        stream = shard_stream([nxt])
        eot = _first_eot(stream)
        pending.append(np.asarray(stream.read(0, stream.total if eot is None else eot + 1)))
        if eot is not None:
            yield np.concatenate(pending)
            return


def _split(tokens: np.ndarray, pending: list[np.ndarray]) -> Iterator[np.ndarray]:
    """Documents ending in ``tokens``; the unfinished tail is left in ``pending`` (emptied as used)."""
    start = 0
    for end in np.flatnonzero(tokens == llmc.GPT2_EOT):
        piece = np.asarray(tokens[start:end + 1])
        if pending:
            pending.append(piece)
            piece = np.concatenate(pending)
            pending.clear()
        yield piece
        start = end + 1
    if start < len(tokens):
        pending.append(np.asarray(tokens[start:]))


class Decoded(NamedTuple):
    """A document decoded: its original ``id`` (a bucketed tree's; None in llm.c shards) and its ``text``."""

    id: str | None
    text: str


def shard_documents(paths: Sequence[str], token_bytes, docs: int | None, markers: bool,
                    log: TextIO) -> Iterator[Decoded]:
    """The first ``docs`` documents of the llm.c shards ``paths`` (all for None), read as they are drawn."""
    rendered = (Decoded(None, render(tokens, token_bytes, markers)) for tokens in iter_documents(paths, log))
    return rendered if docs is None else itertools.islice(rendered, docs)


def decode(paths: Sequence[str], token_bytes, docs: int | None, markers: bool, out: TextIO, log: TextIO) -> int:
    """Write up to ``docs`` documents of ``paths`` to ``out``; the number written."""
    return write(shard_documents(paths, token_bytes, docs, markers, log), out)


def write(documents: Iterable[Decoded], out: TextIO) -> int:
    """Each document as the command prints it: a tree's after its ``==> ID <==`` line, llm.c
    shards' with a blank line between them; the number written."""
    written = 0
    for doc in documents:
        if doc.id is not None:
            out.write(f"==> {doc.id} <==\n{doc.text}\n")
        else:
            out.write(("\n" if written else "") + doc.text + "\n")
        written += 1
    return written


def is_bucketed_tree(path: str) -> bool:
    """Whether ``path`` is a bucketed output tree (a directory holding a manifest), finished or not."""
    url = storage.normalize(path)
    fs, p = storage.filesystem(url)
    with storage.reaching(url):  # a store out of reach is one line, naming it
        return fs.isdir(p) and fs.exists(posixpath.join(p.rstrip("/"), layout.MANIFEST_NAME))


def tree_token_bytes(spec: str, eos_id: int, where: str) -> Callable[[Sequence[int]], bytes]:
    """The bytes of ids for the job's tokenizer ``spec`` (load_encoder's specs), EOS included.

    tiktoken-backed tokenizers (jet-nemotron, qwen2.5, gpt2, tiktoken:, trained:) decode offline
    from their ranks; hf: ones through Hugging Face tokenizers."""
    try:
        encoder = load_encoder(spec)
    except (ImportError, OSError, ValueError) as e:
        raise BadInputError(where, f"its tokenizer {spec!r} cannot be loaded here ({e}); give --tokenizer") from None
    if encoder.eos_id != eos_id:
        raise BadInputError(where, f"was written with EOS {eos_id}, but the tokenizer {spec!r} has EOS "
                                   f"{encoder.eos_id}: give the tokenizer the tree was written with")
    backend = encoder.backend
    if hasattr(backend, "decode_bytes"):  # tiktoken.Encoding
        return lambda ids: backend.decode_bytes(list(ids))
    return lambda ids: backend.decode(list(ids), skip_special_tokens=False).encode("utf-8")


def tree_documents(tree: ShardTree, docs: int | None, doc_id: str | None) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens without the final EOS) of the tree's first ``docs`` documents, or of ``doc_id``."""
    if doc_id is not None:
        try:
            rows: Iterator[int] | range = iter([tree.row(doc_id)])
        except KeyError:
            raise BadInputError(tree.url, f"holds no document with id {doc_id!r}") from None
    else:
        rows = range(len(tree) if docs is None else min(docs, len(tree)))
    for i in rows:
        tokens = tree.document(i)
        yield tree.documents.id(i), tokens[:-1]  # a document's last token is its EOS: the format's and the manifest's


def decoded_tree(path: str, tokenizer: str | None, docs: int | None, doc_id: str | None) -> Iterator[Decoded]:
    """The documents of the bucketed tree at ``path`` (opened, and its tokenizer loaded, now)."""
    try:
        tree = open_tree(path)
    except (FileNotFoundError, ValueError) as e:  # unfinished (IncompleteTreeError), damaged
        raise BadInputError(path, str(e)) from None
    token_bytes = tree_token_bytes(tokenizer or tree.stats.tokenizer, tree.eos_id, path)
    return (Decoded(doc, token_bytes(tokens.tolist()).decode("utf-8", errors="replace"))
            for doc, tokens in tree_documents(tree, docs, doc_id))


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """decode's settings, one typed object: its flags are generated from it."""

    paths: tuple[str, ...] = setting(REQUIRED, "a bucketed output tree; or llm.c shard files (in order) or split "
                                     "directories", flags=(), metavar="PATH", many=True)
    docs: int | None = setting(None, "print only the first N documents", spelled=int)
    doc_id: str | None = setting(None, "a bucketed tree: print only the document with this original id",
                                 flags=("--id",), metavar="ID")
    markers: bool = setting(False, "print each word's <ff_N> countdown marker before it")
    tokenizer: str | None = setting(None, "a bucketed tree: the tokenizer its dataset_stats.txt names unless given "
                                    "(any --tokenizer spec of the jobs); llm.c shards: gpt2 | tiktoken:PATH | "
                                    "hf:NAME_OR_PATH, default gpt2")

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(self.paths))
        if self.docs is not None and self.docs < 0:
            raise ValueError("--docs must be >= 0")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretokenize decode",
                                description="Print a bucketed tree's documents, or llm.c scaffold shards, as text.",
                                formatter_class=DefaultsHelpFormatter)
    add_setting_flags(p, DecodeSettings)
    return p


def parse_args(argv: list[str]) -> DecodeSettings:
    return parse_plain_settings(make_parser(), argv, DecodeSettings)  # a bad value: exit 2, as every tool


def documents(args: DecodeSettings, log: TextIO) -> Iterator[Decoded]:
    """The documents ``args`` asks for, decoded as they are drawn (the paths and the flags judged
    now: a UsageError for flags that do not go together); notes on ``log``."""
    if len(args.paths) == 1 and is_bucketed_tree(args.paths[0]):
        if args.markers:
            raise UsageError("--markers is for the scaffold's countdown tokens, not a bucketed tree")
        if args.doc_id is not None and args.docs is not None:
            raise UsageError("give --docs N or --id ID, not both")
        return decoded_tree(args.paths[0], args.tokenizer, args.docs, args.doc_id)
    if any(is_bucketed_tree(p) for p in args.paths):
        raise UsageError("give one bucketed tree at a time, not with other paths")
    if args.doc_id is not None:
        raise UsageError("--id reads a bucketed tree (its documents have ids); llm.c shards are read by "
                         "position (--docs N)")
    return shard_documents(args.paths, load_token_bytes(args.tokenizer or "gpt2"), args.docs, args.markers, log)


def run(argv: list[str] | None = None) -> int:
    write(documents(parse_args(argv or []), sys.stderr), sys.stdout)
    return 0
