"""VerifyOutput: check a bucketed output tree against its format, file by file, in parallel.

The launcher scans the manifest once (streaming: it keeps only where each file's rows are) and
lists the bucket directories; each file is then one unit of work:

    names       bucket directory, pPP_NNNNN.npy, partition below the stats' partition count
    size        a multiple of the dtype; equal to the sum of the file's manifest counts
    documents   each one's length inside its bucket's bounds, ending with exactly one EOS and
                holding no other (unless the stats say special_tokens: tokenizer, where an EOS may
                stand inside a document), every id below the vocabulary size
    pairing     no file without manifest rows, no manifest row without its file
    contents    each file's sha256 equal to its line in checksums.sha256 (a missing checksum
                file is a problem: without it a changed token would pass)
    removals    no stored id that the tree's removals.txt (or a --removal-list) says is removed
    stats       documents, tokens and files per bucket equal to the manifest's; read = kept + dropped
    index       the reader index (processed_spec.idx), where the record lists one, byte for byte
                what the manifest gives (shards.index)

With ``--input``, the source documents are read again, filtered with the settings the stats
record, tokenized with the tokenizer and special-token mode they name (by the other backend than the one that wrote the
tree, where it has two: tiktoken for a quicktok tree, quicktok for a tiktoken one), and compared
id for id with what is stored (all of them, or a stable ``--sample`` fraction of ids). Records the
job could not have stored (bad records: null fields, bad ids, lines that are not JSON, ...) are
skipped and counted by reason; the counts must equal the stats' drop rows for those reasons, as a
run with ``--on-bad-record skip`` wrote them (a run with ``fail`` would have stopped: its stats
have none).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
import stat
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa

from shards import index as reader_index
from shards import layout, manifest, storage, tree
from shards.card import CARD_NAME
from shards.index import INDEX_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from transforms.bucketed.filter import batch_masks, drop_masks, keep_tokens
from transforms.bucketed.settings import BucketedSettings
from transforms.bucketed.tokenize import TokenizeDocuments, TokenizerConfig
from transforms.core.batches import DocBatch, TokenBatch
from transforms.core.drops import DUPLICATE_ID
from transforms.core.progress import Progress
from transforms.core.records import DROPPED
from transforms.core.spill import refs_file_strings
from transforms.inputs.read import ReadDocuments
from transforms.removal import REMOVED
from transforms.tokenizers.backends import other_backend

MAX_REPORTED = 1000
# The bucketed job's drop reasons that are not bad records; every other reason in its stats is one
# (null_field, bad_id, invalid_json, ...: what ReadDocuments skips under on_bad_record="skip").
NOT_BAD_RECORD_REASONS = frozenset({REMOVED, DUPLICATE_ID})


def job_settings(stats: DatasetStats, input_pattern: str = "") -> BucketedSettings:
    """The settings of the run the stats record that say what was read and filtered: the
    filter's conditions and the input field settings (defaults where none are recorded). Bad
    records are skipped and counted, as the job did under --on-bad-record skip."""
    return BucketedSettings(input_pattern, "", on_bad_record="skip", **stats.filter, **stats.field_settings)


class FileUnit(NamedTuple):
    rel_path: str
    manifest_start: int  # byte range of the file's rows in the manifest; -1 when it has none
    manifest_end: int
    on_disk: bool


class FileSummary(NamedTuple):
    bucket: str
    documents: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    output: str
    dtype: str
    eos_id: int
    vocab_size: int
    partitions: int
    sample: float = 1.0
    # rel_path -> sha256 from checksums.sha256; None when the tree has no such file.
    checksums: dict[str, str] | None = None
    # True when the stats say special_tokens: tokenizer: an EOS inside a document is then text's id,
    # not a problem (the manifest, not EOS, says where documents end).
    eos_inside: bool = False
    # The tree's conditions on @tokens (shards/conditions.py): the manifest's counts are judged by them.
    length_conditions: tuple = ()

    def sampled(self, doc_id: str) -> bool:
        """A stable choice of ids for --sample, independent of the layout's hashes."""
        if self.sample >= 1.0:
            return True
        h = int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8, person=b"verify").digest(), "little")
        return h < self.sample * 2**64


@dataclasses.dataclass
class ManifestScan:
    units: dict[str, tuple[int, int]]
    problems: list[str]
    rows: int


def scan_manifest(output: str, removed: Mapping[str, str] | None = None) -> ManifestScan:
    """Where each file's rows are in the manifest, and the problems of its structure.

    ``removed`` maps ids that must not be stored to the list that says so (``removals.txt``, a
    ``--removal-list``): each row holding one is a problem naming the id and its file.
    """
    removed = removed or {}
    fs, root = storage.filesystem(output)
    path = posixpath.join(root, layout.MANIFEST_NAME)
    units: dict[str, tuple[int, int]] = {}
    problems: list[str] = []
    if not fs.exists(path):
        return ManifestScan(units, [f"{layout.MANIFEST_NAME}: missing"], 0)
    rows = 0
    with storage.open_read(fs, path) as f:
        header = f.readline()
        if header.decode("utf-8", "replace").rstrip("\n") != manifest.MANIFEST_HEADER:
            problems.append(f"{layout.MANIFEST_NAME}: header is {header[:80]!r}")
        pos = len(header)
        current, start = None, pos
        line_no = 1
        for raw in f:
            line_no += 1
            try:
                rel, doc_id, _ = manifest.parse_row(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                problems.append(f"{layout.MANIFEST_NAME} line {line_no}: {e}")
                pos += len(raw)
                continue
            rows += 1
            if doc_id in removed:
                problems.append(f"{rel}: id {doc_id} is stored, but {removed[doc_id]} lists it as removed")
            if rel != current:
                if current is not None:
                    units[current] = (start, pos)
                if rel in units:
                    problems.append(f"{layout.MANIFEST_NAME} line {line_no}: rows of {rel} are not contiguous")
                current, start = rel, pos
            pos += len(raw)
        if current is not None:
            units[current] = (start, pos)
    return ManifestScan(units, problems, rows)


def list_shard_files(output: str) -> set[str]:
    """Relative paths of every file in the bucket directories (names are checked per file)."""
    fs, root = storage.filesystem(output)
    found = set()
    for bucket in layout.BUCKET_NAMES:
        bucket_dir = posixpath.join(root, bucket)
        if not fs.isdir(bucket_dir):
            continue
        for path in fs.find(bucket_dir):
            rel = posixpath.relpath(path, root)
            found.add(rel)
    return found


def checksum_table(output: str) -> tuple[dict[str, str] | None, list[str]]:
    """The tree's checksums (None when they cannot be read: shards.manifest.read_checksums) and
    their problems. A missing file is one: every finished tree has it, and without it no content
    check would run."""
    try:
        table = manifest.read_checksums(output)
    except ValueError as e:
        return None, [f"{layout.CHECKSUMS_NAME}: unreadable: {e}"]
    if table is None:
        return None, [f"{layout.CHECKSUMS_NAME}: missing: the shards' contents cannot be checked"]
    return table, []


def index_problems(output: str) -> list[str]:
    """The reader index (shards.index), when the tree's record lists one: there, and the same bytes
    as an index built again from the manifest."""
    record = tree.read_record(output)
    name = reader_index.INDEX_NAME
    if record is None or name not in record.derived:
        return []
    fs, root = storage.filesystem(output)
    path = posixpath.join(root, name)
    if not fs.exists(path):
        return [f"{name}: listed in the tree's record but missing"]
    digest = hashlib.sha256()
    with storage.open_read(fs, path) as f:
        while block := f.read(1 << 20):
            digest.update(block)

    class _Hashing:
        def __init__(self):
            self.digest = hashlib.sha256()

        def write(self, data):
            self.digest.update(data)

    rebuilt = _Hashing()
    try:
        reader_index.build_from_manifest(fs, root, rebuilt)
    except (ValueError, FileNotFoundError) as e:
        return [f"{name}: cannot be rebuilt from {layout.MANIFEST_NAME} to compare: {e}"]
    if rebuilt.digest.digest() != digest.digest():
        return [f"{name}: does not describe {layout.MANIFEST_NAME} (readers do not use it: they check it at open and "
                "read the manifest instead, with a warning; a publish or a remove rewrites it)"]
    return []


def plan_units(output: str, removed: Mapping[str, str] | None = None) -> tuple[list[FileUnit], list[str], int]:
    """The files to check: those the manifest names, and those of the tool's record (shards/tree.py)
    on disk. A file the user put in a bucket directory is not the tool's: it is not checked."""
    scan = scan_manifest(output, removed)
    record = tree.read_record(output)
    on_disk = {rel for rel in list_shard_files(output) if rel in scan.units or tree.is_ours(record, rel)}
    names = sorted(set(scan.units) | on_disk)
    units = [
        FileUnit(rel, *scan.units.get(rel, (-1, -1)), rel in on_disk)
        for rel in names
    ]
    return units, scan.problems, scan.rows


SCAN_CHUNK = 8 << 20
# Files verify does not scan for removed ids: the log (it lists them), and files of no ids' text.
# The reader index holds exactly the manifest's ids (index_problems checks it against the manifest),
# so a stored id is reported once, from the manifest's rows, not again from the index.
NOT_SCANNED = {"removals.txt", layout.CHECKSUMS_NAME, tree.RECORD_NAME, INDEX_NAME}
# The stats and the dataset card made from them are written from counts and settings: a removed id
# that is a number (a row id, say) is in their text by chance, so there such ids are not searched.
FROM_COUNTS = {layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME}
NUMBER_ID = re.compile(r"[-+]?[0-9][0-9.,_]*")
# A references file larger than this is searched by its bytes (in chunks) rather than parsed whole.
MAX_PARSED_REFS = 64 << 20


def files_holding_ids(output: str, removed: Mapping[str, str], shards: set[str]) -> list[str]:
    """A problem for each file under the tree, its temporary directory included, that holds a
    removed id's text, but the shards (their documents are checked through the manifest), the
    manifest (scan_manifest checks each row) and the files of NOT_SCANNED. A removed document's
    saved work (spill references, markers) or a description that names it is found this way:
    every byte of a file is searched, but for a job's own saved work, read as what it is
    (_saved_work_ids), and ids that are numbers in the stats and the card (FROM_COUNTS). The
    temporary directory's size is the cost."""
    if not removed:
        return []
    fs, root = storage.filesystem(output)
    everywhere = _id_pattern(removed)
    # In the stats and the card, words (``total``, a bucket's name) are theirs: an id matches there only
    # as a whole word, not inside ``total_tokens``.
    in_counts = _id_pattern({i: w for i, w in removed.items() if not NUMBER_ID.fullmatch(i)}, whole=True)
    overlap = max(len(i.encode("utf-8")) for i in removed) - 1
    problems = []
    for path in sorted(fs.find(root)):
        rel = posixpath.relpath(path, root.rstrip("/") or "/")
        if rel in shards or rel in NOT_SCANNED or rel == layout.MANIFEST_NAME:
            continue
        if storage.renames_atomically(fs):
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                continue  # never followed (it may point outside the tree)
            if not stat.S_ISREG(mode):  # a FIFO would wait for a writer forever: never opened
                problems.append(f"{rel}: not a regular file (a FIFO, a socket or a device): not written by this tool")
                continue
        saved = _saved_work_ids(fs, path, rel, removed)
        if saved is not None:
            problems += [f"{rel}: holds the id {doc_id}, which {removed[doc_id]} lists as removed" for doc_id in saved]
            continue
        pattern = in_counts if rel in FROM_COUNTS else everywhere
        if pattern is None:
            continue
        with storage.open_read(fs, path) as f:
            tail = b""
            while chunk := f.read(SCAN_CHUNK):
                m = pattern.search(tail + chunk)
                if m:
                    doc_id = m.group("id").decode("utf-8")
                    problems.append(f"{rel}: holds the id {doc_id}, which {removed[doc_id]} lists as removed")
                    break
                tail = (tail + chunk)[-overlap:] if overlap else b""
    return problems


def _id_pattern(ids, whole: bool = False) -> re.Pattern | None:
    """One regex matching any of ``ids``' UTF-8 bytes (group ``id``), the longest first; with
    ``whole``, only where no letter, digit or ``_`` touches it on either side. None for no ids."""
    if not ids:
        return None
    alternatives = b"|".join(re.escape(i.encode("utf-8")) for i in sorted(ids, key=len, reverse=True))
    edge = rb"(?<![A-Za-z0-9_])", rb"(?![A-Za-z0-9_])"
    return re.compile((edge[0] if whole else b"") + b"(?P<id>" + alternatives + b")" + (edge[1] if whole else b""))


def _saved_work_ids(fs, path: str, rel: str, removed: Mapping[str, str]) -> list[str] | None:
    """For a job's saved work in the temporary directory, the removed ids it holds, read as what it
    is: a spill file (``NAME.bin`` beside its ``NAME.refs``) holds tokens and no id; a references
    file's strings (its source, its columns' names, the ids and every string column) are matched
    whole: a removed ``doc-1`` is not ``doc-10``, nor a ``3`` in a number. None for any other file,
    or a references file too large or that does not parse: its bytes are searched instead."""
    if not rel.startswith(layout.TEMP_DIR_NAME + "/"):
        return None
    if rel.endswith(".bin") and _regular_file(fs, path[:-len(".bin")] + ".refs"):
        return []
    if not rel.endswith(".refs") or fs.size(path) > MAX_PARSED_REFS:
        return None

    with storage.open_read(fs, path) as f:
        data = f.read()
    try:
        held = {text for text in refs_file_strings(data) if text in removed}
    except Exception:  # noqa: BLE001 - anything it cannot read as references (a crafted file) is searched as bytes
        return None
    return sorted(held)[:1]


def _regular_file(fs, path: str) -> bool:
    """Whether ``path`` is a regular file, not reached through a link (on a local disk)."""
    if not storage.renames_atomically(fs):
        return fs.isfile(path)
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def check_file(unit: FileUnit, config: VerifyConfig) -> Iterator[tuple[str, object]]:
    """("problem", text), ("summary", FileSummary) and, for sampled ids, ("tokens", (id, list))."""
    rel = unit.rel_path
    name = yield from _readable_shard(unit, config)
    if name is None:
        return
    fs, root = storage.filesystem(config.output)
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME)) as f:
        f.seek(unit.manifest_start)
        text = f.read(unit.manifest_end - unit.manifest_start).decode("utf-8")
    rows = [manifest.parse_row(line) for line in text.splitlines() if line.strip()]
    yield from _length_problems(rel, rows, config.length_conditions)
    dtype = layout.DTYPES[config.dtype]
    size = fs.size(posixpath.join(root, rel))
    if size % dtype.itemsize:
        yield "problem", f"{rel}: size {size} is not a multiple of {dtype.itemsize} ({config.dtype})"
    expected = sum(n for _, _, n in rows)
    if size // dtype.itemsize != expected:
        yield "problem", f"{rel}: holds {size // dtype.itemsize} tokens, its manifest rows count {expected}"
    try:
        f = storage.open_read(fs, posixpath.join(root, rel))
    except storage.NotRegularFileError as e:
        yield "problem", f"{rel}: {e}"
        return
    with f:
        digest, tokens_seen = yield from _check_documents(f, rel, name.bucket, rows, config)
    if config.checksums is not None:
        want = config.checksums.get(rel)
        if want is None:
            yield "problem", f"{rel}: not listed in {layout.CHECKSUMS_NAME}"
        elif digest != want:
            yield "problem", f"{rel}: content differs from its sha256 in {layout.CHECKSUMS_NAME}"
    yield "summary", FileSummary(name.bucket, len(rows), tokens_seen)


def _length_problems(rel: str, rows: list[tuple[str, str, int]], conditions) -> Iterator[tuple[str, str]]:
    """The stored documents a condition on ``@tokens`` rejects: the manifest's counts say so, with
    or without the source."""
    if not conditions or not rows:
        return
    counts = pa.array([n for _, _, n in rows], pa.int64())
    for name, mask in drop_masks(lambda _: counts, conditions, len(rows)).items():
        for i in np.flatnonzero(mask).tolist():
            yield "problem", f"{rel}: id {rows[i][1]} holds {rows[i][2]} tokens, but the tree keeps only {name}"


def _readable_shard(unit: FileUnit, config: VerifyConfig) -> Iterator[tuple[str, object]]:
    """The problems that stop a file from being read (its name, its place, its manifest rows);
    returns its parsed name when it can be read, else None."""
    rel = unit.rel_path
    try:
        name = layout.parse_shard_rel_path(rel)
    except ValueError:
        yield "problem", f"{rel}: not a shard file name of this layout (bucket/pPP_NNNNN.npy)"
        return None
    if name.partition >= config.partitions:
        yield "problem", f"{rel}: partition {name.partition} is outside 0..{config.partitions - 1}"
    try:
        tree.Tree(config.output).path(rel, "shard")
    except tree.UnsafePathError as e:
        yield "problem", f"{rel}: not read: {e}"
        return None
    if not unit.on_disk:
        yield "problem", f"{rel}: listed in the manifest but missing"
        return None
    if unit.manifest_start < 0:
        yield "problem", f"{rel}: file without manifest rows"
        return None
    return name


def _check_documents(f, rel: str, bucket: str, rows: list, config: VerifyConfig) -> Iterator[tuple[str, object]]:
    """Each document of the open shard ``f`` against its manifest row (its bucket, its EOS, its ids),
    the sampled ones' tokens yielded; returns the file's sha256 and the tokens read."""
    dtype = layout.DTYPES[config.dtype]
    low, high = layout.bucket_range(bucket)
    tokens_seen = 0
    digest = hashlib.sha256()
    for k, (_, doc_id, n) in enumerate(rows):
        where = f"{rel} document {k} ({doc_id})"
        if n < low or (high is not None and n > high):
            yield "problem", f"{where}: {n} tokens do not belong in bucket {bucket} ({low}..{high or 'inf'})"
        data = f.read(n * dtype.itemsize)
        digest.update(data)
        doc = np.frombuffer(data[: len(data) - len(data) % dtype.itemsize], dtype=dtype)
        if len(doc) < n:
            yield "problem", f"{where}: the file ends after {len(doc)} of its {n} tokens"
            break
        tokens_seen += n
        eos = np.flatnonzero(doc == config.eos_id)
        if len(eos) == 0 or eos[-1] != n - 1:
            yield "problem", f"{where}: does not end with EOS {config.eos_id}"
        if not config.eos_inside and (len(eos) > 1 or (len(eos) == 1 and eos[0] != n - 1)):
            inner = [int(i) for i in eos if i != n - 1]
            yield "problem", f"{where}: EOS inside the document at token {inner[0]}"
        if n and int(doc.max()) >= config.vocab_size:
            yield "problem", f"{where}: token id {int(doc.max())} is not below the vocabulary {config.vocab_size}"
        if config.sample > 0 and config.sampled(doc_id):
            yield "tokens", (doc_id, doc.tolist())
    while rest := f.read(1 << 20):
        digest.update(rest)
    return digest.hexdigest(), tokens_seen


class CheckFileFn(beam.DoFn):
    def __init__(self, config: VerifyConfig, compare: bool):
        self._config = config
        self._compare = compare
        self._checked = beam.metrics.Metrics.counter("pretokenize", "files_verified")

    def setup(self):
        self._progress = Progress("verify")

    def process(self, unit: FileUnit):
        for kind, value in check_file(unit, self._config):
            if kind == "problem":
                yield beam.pvalue.TaggedOutput("problems", value)
            elif kind == "summary":
                yield beam.pvalue.TaggedOutput("summaries", value)
            elif self._compare:
                yield value
        self._checked.inc()
        self._progress.add(files=1)


def stats_problems(stats: DatasetStats, summaries: list[FileSummary]) -> list[str]:
    problems = []
    sums: dict[str, list[int]] = {}
    for s in summaries:
        b = sums.setdefault(s.bucket, [0, 0, 0])
        b[0] += s.documents
        b[1] += s.tokens
        b[2] += 1
    for name in layout.BUCKET_NAMES:
        want = stats.buckets.get(name)
        want_t = (want.documents, want.tokens, want.files) if want else (0, 0, 0)
        got = tuple(sums.get(name, [0, 0, 0]))
        if want_t != got:
            problems.append(
                f"{layout.STATS_NAME}: bucket {name} says documents/tokens/files {want_t}, the files hold {got}"
            )
    if stats.kept_documents + stats.dropped_documents != stats.raw_documents:
        problems.append(
            f"{layout.STATS_NAME}: {stats.raw_documents} read but {stats.kept_documents} kept + "
            f"{stats.dropped_documents} dropped"
        )
    return problems


def bad_record_problems(stats: DatasetStats, found: Mapping[str, int]) -> list[str]:
    """The stats' drops for bad records against the bad records found in the input, by reason.

    A run with --on-bad-record skip dropped and counted each; one with fail would have stopped
    on the first, so its stats have none and neither may the input.
    """
    not_bad = NOT_BAD_RECORD_REASONS | {c.name for c in job_settings(stats).conditions()}
    reasons = set(found) | {r for r in stats.drops if r not in not_bad}
    problems = []
    for reason in sorted(reasons):
        want, got = stats.drops.get(reason, 0), found.get(reason, 0)
        if want != got:
            problems.append(f"{layout.STATS_NAME}: {want} documents dropped as {reason}, "
                            f"but the input holds {got} such bad records")
    return problems


def compare_with_source(element, removed_ids: frozenset[str]):
    """Problems of one id after the stored and the re-tokenized sides are joined."""
    doc_id, sides = element
    stored = list(sides["stored"])
    # Of several copies of an id in the input, the job keeps the first by (input file, row).
    expected = [tokens for _, tokens in sorted(sides["expected"])[:1]]
    if len(stored) > 1:
        yield f"id {doc_id}: stored {len(stored)} times"
    if stored and not expected:
        yield f"id {doc_id}: stored, but the input has no such document kept by the filter"
    elif expected and not stored:
        if doc_id not in removed_ids:
            yield f"id {doc_id}: kept by the filter but missing from the output"
    elif stored and expected and stored[0] != expected[0]:
        a, b = stored[0], expected[0]
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        yield f"id {doc_id}: stored tokens differ from the re-tokenized input at token {first} " \
              f"(stored {len(a)} tokens, expected {len(b)})"


class VerifyOutput(beam.PTransform):
    """Checks the tree; yields one report dict (problems counted, a sorted sample of them, totals).

    ``removed_ids`` are ids not expected in the source comparison (the launcher reports those
    that are stored among ``launch_problems``, see scan_manifest).
    """

    def __init__(self, config: VerifyConfig, units: list[FileUnit], launch_problems: list[str],
                 stats: DatasetStats, input_pattern: str | None = None, removed_ids: frozenset[str] = frozenset()):
        super().__init__()
        self._config, self._units, self._launch = config, units, launch_problems
        self._stats, self._input, self._removed = stats, input_pattern, removed_ids
        self.retokenizer: str | None = None  # the library that re-encodes the input (with --input)
        if input_pattern:
            self._read = ReadDocuments(job_settings(stats, input_pattern).read_config())
            # Re-encoded with the other backend than the one the stats say wrote the tree (where the
            # tokenizer has two), so that a divergence between them cannot hide.
            backend = other_backend(stats.tokenizer_backend)
            self._tokenizer = TokenizerConfig(spec=stats.tokenizer, dtype=stats.dtype, backend=backend,
                                              special_tokens=stats.special_tokens)
            self.retokenizer = self._tokenizer.load().library
            self._read.log_planned()

    def _source_problems(self, pbegin, stored_tokens) -> list:
        """With --input: the bad records of the source against the stats' drops, and the sampled
        documents re-encoded from the source against their stored tokens."""
        stats, config = self._stats, self._config
        conditions = job_settings(stats).conditions()
        read = pbegin | "ReadInput" >> self._read
        bad_records = (
            read[DROPPED]
            | "CountBadRecords" >> beam.CombinePerKey(sum)
            | "CollectBadRecords" >> beam.combiners.ToDict()
            | "CheckBadRecords" >> beam.FlatMap(lambda found: bad_record_problems(stats, found))
        )
        expected = (
            read.docs
            | "SelectSample" >> beam.FlatMap(select_sample, config, conditions)
            | "Retokenize" >> TokenizeDocuments(self._tokenizer)
            | "KeepByLength" >> beam.Map(lambda batch: keep_tokens(batch, ~_dropped(batch, conditions)))
            | "KeyById" >> beam.FlatMap(per_document)
        )
        compared = (
            {"stored": stored_tokens, "expected": expected}
            | "JoinById" >> beam.CoGroupByKey()
            | "CompareTokens" >> beam.FlatMap(compare_with_source, self._removed)
        )
        return [bad_records, compared]

    def expand(self, pbegin):
        checked = (
            pbegin
            | "ListFiles" >> beam.Create(self._units)
            | "SpreadFiles" >> beam.Reshuffle()
            | "CheckFiles" >> beam.ParDo(CheckFileFn(self._config, bool(self._input))).with_outputs(
                "problems", "summaries", main="tokens"
            )
        )
        stats = self._stats
        stats_check = (
            checked.summaries
            | "CollectSummaries" >> beam.combiners.ToList()
            | "CheckStats" >> beam.FlatMap(lambda s: stats_problems(stats, s))
        )
        problem_sets = [
            pbegin | "LaunchProblems" >> beam.Create(self._launch),
            checked.problems,
            stats_check,
        ]
        if self._input:
            problem_sets += self._source_problems(pbegin, checked.tokens)
        problems = problem_sets | "AllProblems" >> beam.Flatten()
        count = problems | "CountProblems" >> beam.combiners.Count.Globally()
        sample = problems | "SampleProblems" >> beam.combiners.Top.Smallest(MAX_REPORTED)
        totals = (
            checked.summaries
            | "TotalTokens" >> beam.Map(lambda s: (1, s.documents, s.tokens))
            | "SumTotals" >> beam.CombineGlobally(_sum_totals)
        )
        return (
            pbegin
            | "Start" >> beam.Create([None])
            | "MakeReport"
            >> beam.Map(
                lambda _, n, s, t: {"problems": n, "sample": s, "files": t[0], "documents": t[1], "tokens": t[2]},
                beam.pvalue.AsSingleton(count),
                beam.pvalue.AsSingleton(sample),
                beam.pvalue.AsSingleton(totals),
            )
        )


def _dropped(batch: DocBatch | TokenBatch, conditions) -> np.ndarray:
    """The documents of a batch the conditions it can be judged by drop."""
    return np.logical_or.reduce([np.zeros(batch.size, bool), *batch_masks(batch, conditions).values()])


def select_sample(batch: DocBatch, config: VerifyConfig, conditions) -> Iterator[DocBatch]:
    """The documents of a batch the job kept (the conditions the stats record) whose id is sampled;
    those on ``@tokens`` are checked once the documents are re-tokenized (_source_problems)."""
    keep = ~_dropped(batch, conditions)
    keep &= np.fromiter((config.sampled(i) for i in batch.column("id")), bool, batch.size)
    if keep.any():
        yield batch.filter(pa.array(keep))


def per_document(batch: TokenBatch) -> Iterator[tuple[str, tuple[tuple[str, int], list[int]]]]:
    ends = np.cumsum(batch.lengths)
    for doc_id, row, end, n in zip(batch.ids, batch.rows.tolist(), ends.tolist(), batch.lengths.tolist(), strict=True):
        yield doc_id, ((batch.source, row), batch.tokens[end - n:end].tolist())


def _sum_totals(rows) -> tuple[int, int, int]:
    files = documents = tokens = 0
    for f, d, t in rows:
        files, documents, tokens = files + f, documents + d, tokens + t
    return files, documents, tokens


def write_report(report: dict, url: str) -> None:
    storage.write_atomic(url, json.dumps(report).encode("utf-8"))
