"""The two text files that describe a bucketed output tree.

``processed_spec.txt``: a header, then one row per stored document, ``rel_path | original_id |
processed_token_count``. Rows of one file appear in that file's document order, so a document's
offset in its file is the sum of the counts of the rows before it.

``dataset_stats.txt``: how many documents came in, what was dropped and why, and documents, tokens
and files per bucket. It is written last: its presence marks the tree as complete.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Iterable, Iterator

from shards import conditions, storage
from shards.layout import BUCKET_NAMES, CHECKSUMS_NAME

MANIFEST_HEADER = "rel_path | original_id | processed_token_count"
SEP = " | "


def id_problem(doc_id: str) -> str | None:
    """Why ``doc_id`` cannot be written as a manifest row (None when it can).

    The manifest is one row a line with ``|`` between fields, so an id holding a line break or a
    ``|`` would be read back wrong, and surrounding spaces would be lost when the row is parsed.
    """
    if doc_id == "":
        return "the id is empty"
    if "|" in doc_id:
        return "the id contains '|', the manifest's field separator"
    if any(c in doc_id for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        return "the id contains a line break"
    if doc_id != doc_id.strip():
        return "the id has leading or trailing whitespace"
    if doc_id.startswith("\ufeff"):
        # A removal list's first line could not name it: a UTF-8 byte order mark is those bytes.
        return "the id starts with U+FEFF, which on a removal list's first line reads as a byte order mark"
    if has_lone_surrogate(doc_id):
        return "the id holds a lone UTF-16 surrogate, which no UTF-8 file can store"
    return None


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a code point U+D800..U+DFFF (JSON's "\\ud800" escape can make one)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def format_row(rel_path: str, doc_id: str, token_count: int) -> str:
    problem = id_problem(doc_id)
    if problem:
        raise ValueError(f"cannot write id {doc_id!r} to the manifest: {problem}")
    return row_text(rel_path, doc_id, token_count)


def row_text(rel_path: str, doc_id: str, token_count: int) -> str:
    """A manifest line, the one place its layout is written: for an id already checked (``id_problem``,
    as the job checks every id it reads); ``format_row`` checks it first."""
    return f"{rel_path}{SEP}{doc_id}{SEP}{token_count}\n"


def format_checksums(sums: dict[str, str]) -> str:
    """checksums.sha256: one "HEX  rel_path" line a shard, in path order (sha256sum's format)."""
    return "".join(f"{sums[rel]}  {rel}\n" for rel in sorted(sums))


def parse_checksums(text: str, where: str | None = None) -> dict[str, str]:
    """checksums.sha256's {rel_path: sha256}; a ValueError naming ``where`` (the file) and the line
    for a line that is not sha256sum's."""
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            digest, sep, rel = line.partition("  ")
            if not sep or len(digest) != 64:
                place = f"{where} line {number}: " if where else ""
                raise ValueError(f"{place}not a sha256sum line: {line[:200]!r}")
            sums[rel] = digest
    return sums


def read_checksums(output: str) -> dict[str, str] | None:
    """The tree's checksums.sha256, parsed; None when it has none (a tree written before checksums
    existed). A ValueError naming the file and its line when a line is damaged."""
    fs, root = storage.filesystem(output)
    path = posixpath.join(root, CHECKSUMS_NAME)
    if not fs.exists(path):
        return None
    where = storage.join(output, CHECKSUMS_NAME)
    try:
        text = storage.read_bytes(fs, path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 ({e})") from None
    return parse_checksums(text, where)


def parse_row(line: str) -> tuple[str, str, int]:
    """(rel_path, original_id, processed_token_count) of one manifest line."""
    parts = line.rstrip("\n").split(SEP)
    if len(parts) != 3:
        raise ValueError(f"manifest row does not have 3 ' | '-separated fields: {line!r}")
    rel_path, doc_id, count = parts
    try:
        n = int(count)
    except ValueError:
        raise ValueError(f"manifest row has a non-integer token count: {line!r}") from None
    return rel_path, doc_id, n


def read_rows(lines: Iterable[str]) -> Iterator[tuple[str, str, int]]:
    """Rows of a manifest given its lines, header checked."""
    it = iter(lines)
    header = next(it, None)
    if header is None or header.rstrip("\n") != MANIFEST_HEADER:
        raise ValueError(f"manifest header is {header!r}, expected {MANIFEST_HEADER!r}")
    for line in it:
        if line.strip():
            yield parse_row(line)


@dataclasses.dataclass
class BucketStats:
    documents: int = 0
    tokens: int = 0
    files: int = 0


# The input field settings (--id-field, --text-field) a tree's stats record: only those that differ
# from the FinePDFs defaults, so a run with the defaults writes the stats it always wrote.
FIELD_SETTINGS = ("id_field", "text_field")


@dataclasses.dataclass
class DatasetStats:
    """Everything ``dataset_stats.txt`` holds. ``drops`` maps a reason to its document count."""

    raw_documents: int
    # The settings that make the filter's conditions (shards.conditions: the default list's
    # shorthands and --keep), typed as the flags give them.
    filter: dict[str, object]
    tokenizer: str
    eos_id: int
    vocab_size: int
    dtype: str
    partitions: int
    seed: int
    buckets: dict[str, BucketStats]
    drops: dict[str, int]
    # Set when the run had a removal list: how many ids it held, how many never appeared.
    removal_list_ids: int | None = None
    removal_ids_not_found: int | None = None
    # The library (and version) that encoded the tree, "quicktok 0.4.0"; trees written before it
    # was recorded have none (tiktoken wrote them).
    tokenizer_backend: str | None = None
    # What an added-token string inside a document became: "text" (the default; then no document holds
    # an EOS before its end) or "tokenizer" (its id: an EOS may appear inside, and only the manifest
    # tells where documents end). Written only when not "text", so older trees read as "text".
    special_tokens: str = "text"
    # The FIELD_SETTINGS that differ from their defaults, as the flags gave them.
    field_settings: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def kept_documents(self) -> int:
        return sum(b.documents for b in self.buckets.values())

    @property
    def total_tokens(self) -> int:
        return sum(b.tokens for b in self.buckets.values())

    @property
    def total_files(self) -> int:
        return sum(b.files for b in self.buckets.values())

    @property
    def dropped_documents(self) -> int:
        return sum(self.drops.values())

    def to_text(self) -> str:
        lines = ["# beam-pretokenize dataset statistics"]
        filter_head, filter_tail = conditions.stats_lines(self.filter)
        settings = [
            ("raw_documents", self.raw_documents),
            *filter_head,
            ("tokenizer", self.tokenizer),
            *([("tokenizer_backend", self.tokenizer_backend)] if self.tokenizer_backend is not None else []),
            *([("special_tokens", self.special_tokens)] if self.special_tokens != "text" else []),
            ("eos_id", self.eos_id),
            ("vocab_size", self.vocab_size),
            ("dtype", self.dtype),
            ("partitions", self.partitions),
            ("seed", self.seed),
            ("kept_documents", self.kept_documents),
            ("dropped_documents", self.dropped_documents),
            ("total_tokens", self.total_tokens),
            ("total_files", self.total_files),
        ]
        if self.removal_list_ids is not None:
            settings += [
                ("removal_list_ids", self.removal_list_ids),
                ("removal_ids_not_found", self.removal_ids_not_found),
            ]
        settings += [(k, self.field_settings[k]) for k in FIELD_SETTINGS if k in self.field_settings]
        settings += filter_tail
        lines += [f"{k}: {v}" for k, v in settings]
        lines += ["", "bucket | documents | tokens | files"]
        for name in BUCKET_NAMES:
            b = self.buckets.get(name, BucketStats())
            lines.append(f"{name} | {b.documents} | {b.tokens} | {b.files}")
        lines += ["", "drop_reason | documents"]
        for reason in sorted(self.drops):
            lines.append(f"{reason} | {self.drops[reason]}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> DatasetStats:
        settings, (buckets, drops) = parse_stats_text(text, {"bucket | documents | tokens | files": _bucket_row,
                                                             "drop_reason | documents": drop_row})
        try:
            stats = cls(
                raw_documents=int(settings["raw_documents"]),
                filter=conditions.from_stats(settings),
                tokenizer=settings["tokenizer"],
                tokenizer_backend=settings.get("tokenizer_backend"),
                eos_id=int(settings["eos_id"]),
                vocab_size=int(settings["vocab_size"]),
                dtype=settings["dtype"],
                partitions=int(settings["partitions"]),
                seed=int(settings["seed"]),
                buckets=buckets,
                drops=drops,
                removal_list_ids=_optional_int(settings, "removal_list_ids"),
                removal_ids_not_found=_optional_int(settings, "removal_ids_not_found"),
                special_tokens=settings.get("special_tokens", "text"),
                field_settings={k: settings[k] for k in FIELD_SETTINGS if k in settings},
            )
        except KeyError as e:
            raise ValueError(f"dataset stats lack the setting {e.args[0]!r}") from None
        check_totals(settings, [("kept_documents", stats.kept_documents), ("total_tokens", stats.total_tokens),
                                ("total_files", stats.total_files)])
        return stats


def parse_stats_text(text: str, tables: dict[str, Callable[[list[str]], tuple]]) -> tuple[dict[str, str], list[dict]]:
    """A dataset_stats.txt read as its ``key: value`` settings and its tables, in the order of
    ``tables``: each maps a table's header line to what makes a (key, value) of a row's `` | ``-
    separated cells (a ValueError for a row that is not one, raised in the file's order). Blank and
    ``#`` lines are skipped. The bucketed and the scaffold job's stats share this shape."""
    settings: dict[str, str] = {}
    rows: dict[str, dict] = {header: {} for header in tables}
    table = None
    # Lines as written ("\n".join), not str.splitlines: a value may hold U+2028 or U+0085 (a --keep
    # string; JSON leaves them as they are), which splitlines would break the line at.
    for line in (raw.removesuffix("\r") for raw in text.split("\n")):
        if not line.strip() or line.startswith("#"):
            continue
        if line in tables:
            table = line
        elif table is None:
            key, _, value = line.partition(": ")
            settings[key] = value
        else:
            key, value = tables[table](line.split(SEP))
            rows[table][key] = value
    return settings, list(rows.values())


def _bucket_row(cells: list[str]) -> tuple[str, BucketStats]:
    name, docs, tokens, files = cells
    return name, BucketStats(int(docs), int(tokens), int(files))


def drop_row(cells: list[str]) -> tuple[str, int]:
    """A row of the drop-reason table: its reason and its count."""
    reason, docs = cells
    return reason, int(docs)


def check_totals(settings: dict[str, str], totals: list[tuple[str, int]]) -> None:
    """ValueError when a total the settings state (``kept_documents: 12``) is not what the tables sum to."""
    for key, value in totals:
        if key in settings and int(settings[key]) != value:
            raise ValueError(f"dataset stats say {key} {settings[key]}, but the tables sum to {value}")


def _optional_int(settings: dict[str, str], key: str) -> int | None:
    return int(settings[key]) if key in settings else None
