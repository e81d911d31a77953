"""Saved work: every finished input unit of a run is kept, so that a re-run does only the rest.

A job's work is cut into input units (transforms.inputs.units: a parquet row group, a JSON file).
ProcessUnits does one unit's whole work in one call: it reads the unit, passes each batch through
the job's steps (filter, tokenize...) and spills the tokens (transforms.core.spill). Then, in this
order:

    1. the unit's spill and references files are closed: on a local disk they are whole, on an
       object store their uploads have completed
    2. its completion marker, ``units/NNNNNN.done``, is written in one piece (a rename on a local
       disk, a single put on an object store, which has no rename). It holds everything the unit
       gave (the RefPointers, records read, drops, the job's own counts) and the size of each
       file those pointers point into
    3. only then does the unit's output leave the step

The saved work of a run lives in ``<output>/.pretokenize-tmp/work-<key>/``, with ``work.json``
saying what it was made from: the job, its settings, each input file's path and version (size and
etag or mtime), the tokenizer's output on a probe text, the tool's version and the hash of its
code. A run whose description is the same resumes: each unit with a marker (whose files are still
there, whole) is not read again, its marker's outputs stand in for the work. Any difference starts
afresh, and the launch says which in one line. Publishing deletes the work directory.

So a kill -9 at any moment leaves units that are done (a marker, written last, with whole files)
and units that are not (no marker: redone; the files they had begun are never pointed to and go
with the work directory). A resumed run gives the same documents, so the same bytes, as a clean one.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import posixpath
from collections.abc import Iterable, Sequence

import apache_beam as beam

from shards import storage, tree
from shards.version import code_version
from transforms.core import progress
from transforms.core.spread import SpreadEvenly
from transforms.inputs.units import unit_cost
from transforms.run.steps import UnitStepsFn

log = logging.getLogger(__name__)

WORK_PREFIX = tree.Tree.WORK_PREFIX
DESCRIPTION_NAME = "work.json"
UNITS_DIR = "units"
MARKER_SUFFIX = ".done"
MARKER_VERSION = 2  # 1 was a pickle: saved work of that format is redone, never unpickled
# Tokenized once at launch: the ids say whether a tokenizer (whatever its spec names) still
# encodes as the saved work's did.
PROBE_TEXT = ("Resume probe: The quick brown fox jumps over 13 lazy dogs; naïve café, Ünïcödé, 日本語, "
              "русский текст, emoji 🙂, tabs\tand  spaces, <|endoftext|> as text.\n")


def tokenizer_probe(encoder) -> str:
    """A hash of what ``encoder`` makes of PROBE_TEXT, with its EOS and vocabulary size, and of the
    sha256 of each file it was built from: two ranks swapped between a kill and the resume change
    the files, whatever they do to the probe, so the saved work is not mixed with the new encoding."""
    tokens, _ = encoder.encode_tokens([PROBE_TEXT])
    files = json.dumps(sorted(getattr(encoder, "files", ()))).encode()
    data = f"{encoder.eos_id} {encoder.vocab_size} ".encode() + tokens.astype("<u4").tobytes() + b" " + files
    return hashlib.sha256(data).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class WorkDescription:
    """What a run's saved work was made from; two runs may share work only when these are equal."""

    job: str
    tool: str
    settings: dict
    inputs: list  # [path, kind, row group, first row, file fingerprint] of each input unit, in plan order
    extra: dict  # the job's own: tokenizer probe, removal ids...

    @classmethod
    def of(cls, job: str, settings, units: Sequence, extra: dict, ignore: Iterable[str] = ()) -> WorkDescription:
        """The description of a run: ``settings`` a job's settings dataclass, ``units`` its InputUnits.
        ``ignore``: settings that do not change the work (``output``, ``restart``...)."""
        skipped = {"input", "output", "restart", "license", "source_dataset", "input_sha256", *ignore}
        values = {k: v for k, v in sorted(dataclasses.asdict(settings).items()) if k not in skipped}
        inputs = [[u.path, u.kind, u.row_group, u.first_row, u.fingerprint] for u in units]
        return cls(job, code_version(), json.loads(json.dumps(values)), inputs, json.loads(json.dumps(extra)))

    @property
    def key(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:20]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> WorkDescription:
        return cls(**json.loads(text))

    def difference(self, old: WorkDescription) -> str:
        """Why ``old`` work cannot serve this run, in a few words ("" when it can)."""
        if old.job != self.job:
            return f"it was the {old.job} job's"
        if old.tool != self.tool:
            return f"the tool changed ({old.tool} -> {self.tool})"
        for name in sorted(set(old.settings) | set(self.settings)):
            a, b = old.settings.get(name), self.settings.get(name)
            if a != b:
                return f"--{name.replace('_', '-')} changed ({a} -> {b})"
        for name in sorted(set(old.extra) | set(self.extra)):
            if old.extra.get(name) != self.extra.get(name):
                return EXTRA_CHANGES.get(name, f"the {name} changed")
        old_files = {u[0]: u[4] for u in old.inputs}
        new_files = {u[0]: u[4] for u in self.inputs}
        for path in sorted(set(old_files) | set(new_files)):
            if path not in old_files:
                return f"input file {path} is new"
            if path not in new_files:
                return f"input file {path} is gone"
            if old_files[path] != new_files[path]:
                return f"input file {path} changed ({old_files[path]} -> {new_files[path]})"
        if old.inputs != self.inputs:
            return "the input is cut into other units"
        return ""


EXTRA_CHANGES = {
    "tokenizer_probe": "the tokenizer encodes differently (its files changed)",
    "removal_ids": "the ids to leave out changed (--removal-list, removals.txt or a pending removal)",
}


class SavedWork:
    """The work directory of one run description under an output's temporary directory."""

    def __init__(self, output: str, description: WorkDescription):
        self.output = storage.normalize(output)
        self.description = description
        self.dir_name = WORK_PREFIX + description.key
        self.url = storage.join(self.output, tree.Tree.temp_name(self.dir_name))
        self.done: set[int] = set()  # the units finished when the run was launched

    @property
    def spill_url(self) -> str:
        return storage.join(self.url, tree.Tree.SPILL_DIR)

    @property
    def units_url(self) -> str:
        return storage.join(self.url, UNITS_DIR)

    def marker_url(self, index: int) -> str:
        return storage.join(self.units_url, f"{index:06d}{MARKER_SUFFIX}")

    def begin(self) -> None:
        """Create the directory and its description (before any unit is done)."""
        storage.write_atomic(storage.join(self.url, DESCRIPTION_NAME), self.description.to_json().encode())

    def done_units(self) -> set[int]:
        """The units whose marker exists."""
        return done_units(self.url)


def done_units(work_url: str) -> set[int]:
    fs, units = storage.filesystem(storage.join(work_url, UNITS_DIR))
    try:
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(units, detail=False)]
    except FileNotFoundError:
        return set()
    stems = [n[:-len(MARKER_SUFFIX)] for n in names if n.endswith(MARKER_SUFFIX)]
    return {int(stem) for stem in stems if stem.isdigit()}


def unfinished_files(work_url: str) -> list[str]:
    """The files of the saved work's spill directory that no finished unit's marker points into
    (a unit that failed or was still running: redone by a re-run), as paths of its filesystem. A
    marker that cannot be read points into nothing: its unit is redone too."""
    fs, root = storage.filesystem(work_url)
    spill = posixpath.join(root, tree.Tree.SPILL_DIR)
    try:
        present = fs.find(spill)
    except FileNotFoundError:
        return []
    kept: set[str] = set()
    for index in done_units(work_url):
        marker = posixpath.join(root, UNITS_DIR, f"{index:06d}{MARKER_SUFFIX}")
        try:
            kept.update(UnitOutputs.from_bytes(fs.cat_file(marker), root).files)
        except (FileNotFoundError, MarkerError):
            continue
    return sorted(set(present) - kept)


def read_description(work_url: str) -> WorkDescription | None:
    """The description a work directory was made for; None when it has none or an unreadable one."""
    fs, path = storage.filesystem(storage.join(work_url, DESCRIPTION_NAME))
    try:
        return WorkDescription.from_json(fs.cat_file(path).decode("utf-8"))
    except (FileNotFoundError, ValueError, TypeError):
        return None


@dataclasses.dataclass(frozen=True)
class UnitOutputs:
    """Everything one unit gave: its main outputs ((group key, RefPointer)s) and, by tag, its side
    outputs; and the size of each file the outputs point into, checked before the marker is
    trusted again. Paths are those of this run's work directory."""

    main: list
    side: dict[str, list]
    files: dict[str, int]

    def to_bytes(self, root: str) -> bytes:
        """The marker: JSON, the paths as names relative to the work directory ``root``."""
        return encode_marker(self, root)

    @classmethod
    def from_bytes(cls, data: bytes, root: str) -> UnitOutputs:
        """A marker read back under ``root``; a MarkerError when it is not one this tool wrote."""
        return decode_marker(data, root)

    def emit(self):
        yield from self.main
        for tag, values in self.side.items():
            for value in values:
                yield beam.pvalue.TaggedOutput(tag, value)


class MarkerError(ValueError):
    """A marker that is not one this tool wrote (another format, a bad value): its unit is redone."""


# A marker is JSON, data only: {"version": 2, "files": {name: size}, "main": [[key, name, offset,
# size, documents], ...], "side": {tag: [value, ...]}}. Names are relative to the work directory;
# a group key or side value is an int, a float, a string, a bool, null, or a tuple of those (a JSON
# array: NamedTuples come back as plain tuples).
def encode_marker(saved: UnitOutputs, root: str) -> bytes:
    def name(path: str) -> str:
        prefix = root.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path} is not under the work directory {root}")
        return path[len(prefix):]

    main = [[_plain(key), name(p.path), p.offset, p.size, p.documents] for key, p in saved.main]
    side = {tag: [_plain(v) for v in values] for tag, values in saved.side.items()}
    files = {name(path): size for path, size in saved.files.items()}
    return json.dumps({"version": MARKER_VERSION, "files": files, "main": main, "side": side},
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _plain(value):
    """``value`` as JSON data: a tuple (or NamedTuple) as a list; anything but plain values refused."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a marker holds ints, floats, strings and tuples of them, not {type(value).__name__}")


def _unplain(value, where: str):
    """The value ``_plain`` made, checked: a list back to a tuple."""
    if isinstance(value, list):
        return tuple(_unplain(v, where) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise MarkerError(f"{where} holds a {type(value).__name__}")


def _count(value, where: str, least: int = 0) -> int:
    if type(value) is not int or value < least:
        raise MarkerError(f"{where} is not a count >= {least}: {value!r}")
    return value


def check_name(name, where: str) -> str:
    """A name read from saved work: a plain relative name (parts joined by /, none empty, "." or
    ".."; no backslash or NUL). It is only a name: shards.tree decides what it may reach."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise MarkerError(f"{where} is not a relative name: {name!r}")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise MarkerError(f"{where} is not a plain relative name: {name!r}")
    return name


def decode_marker(data: bytes, root: str) -> UnitOutputs:
    from transforms.core.spill import RefPointer, spill_path_of

    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise MarkerError("it is not JSON (saved work of an older format is not reused)") from None
    if not isinstance(doc, dict) or set(doc) != {"version", "files", "main", "side"}:
        raise MarkerError("it is not a marker")
    if doc["version"] != MARKER_VERSION:
        raise MarkerError(f"it is of version {doc['version']!r}, not {MARKER_VERSION}")
    if not isinstance(doc["files"], dict) or not isinstance(doc["main"], list) or not isinstance(doc["side"], dict):
        raise MarkerError("it is not a marker")
    root = root.rstrip("/")
    files = {check_name(name, "a file"): _count(size, f"the size of {name}") for name, size in doc["files"].items()}
    main = []
    for entry in doc["main"]:
        if not isinstance(entry, list) or len(entry) != 5:
            raise MarkerError(f"a reference is not [key, file, offset, size, documents]: {entry!r}")
        key, name, offset, size, documents = entry
        name = check_name(name, "a reference's file")
        offset, size = _count(offset, "an offset"), _count(size, "a size", 1)
        if name not in files or offset + size > files[name]:
            raise MarkerError(f"a reference points past what it recorded of {name}")
        main.append((_unplain(key, "a group key"),
                     RefPointer(f"{root}/{name}", offset, size, _count(documents, "a document count", 1))))
    for _, pointer in main:
        twin = spill_path_of(pointer.path)[len(root) + 1:]
        if twin not in files:
            raise MarkerError(f"it records no size of {twin}, the spill file its references point into")
    side = {}
    for tag, values in doc["side"].items():
        if not isinstance(values, list):
            raise MarkerError(f"the {tag} outputs are not a list")
        side[tag] = [_unplain(v, f"a {tag} output") for v in values]
        shape = SIDE_SHAPES.get(tag)
        if shape is not None and not all(_fits(v, shape) for v in side[tag]):
            raise MarkerError(f"a {tag} output is not {shape!r}")
    return UnitOutputs(main, side, {f"{root}/{name}": size for name, size in files.items()})


# What the side outputs the jobs give hold (a tag not here is only checked to be plain data):
# "count" an int >= 0, "int" any int, "str" a string, a tuple the same of each item.
SIDE_SHAPES = {
    "dropped": ("str", "count"),  # transforms.core.drops: (reason, documents)
    "records": "count",  # transforms.inputs.read: records read
    "matched": "str",  # transforms.removal: a listed id seen
    "counts": ("str", ("count", "count", "count", "count", "count")),  # transforms.scaffold.encode
}


def _fits(value, shape) -> bool:
    if isinstance(shape, tuple):
        return isinstance(value, tuple) and len(value) == len(shape) and all(map(_fits, value, shape))
    if shape == "str":
        return isinstance(value, str)
    return type(value) is int and (shape == "int" or value >= 0)


def load_marker(fs, marker_path: str, root: str | None = None) -> UnitOutputs | None:
    """A unit's saved outputs, or None when the marker is missing or not one this tool wrote (then
    the unit is redone): any file it points into missing or not the size it had when the unit
    finished, or a references record that does not parse. ``root``: the work directory (by default
    the marker's ``units/`` directory's parent)."""
    from transforms.core.spill import check_refs

    root = root if root is not None else posixpath.dirname(posixpath.dirname(marker_path))
    try:
        saved = UnitOutputs.from_bytes(fs.cat_file(marker_path), root)
    except FileNotFoundError:
        return None
    except MarkerError as e:
        log.warning("redoing the unit of %s: its marker cannot be used (%s)", marker_path, e)
        return None
    for path, size in saved.files.items():
        try:
            now = fs.size(path)
        except FileNotFoundError:
            now = None
        if now != size:
            log.warning("redoing the unit of %s: %s is %s bytes, it was %d", marker_path, path, now, size)
            return None
    problem = check_refs(fs, [pointer for _, pointer in saved.main])
    if problem:
        log.warning("redoing the unit of %s: %s", marker_path, problem)
        return None
    return saved


class ProcessUnitsFn(UnitStepsFn):
    """(index, InputUnit, done) in; the unit's work through the spill, recorded by a marker, out.

    ``read`` is a DoFn taking an InputUnit, ``steps`` DoFns each taking the previous one's main
    outputs, ``spill`` a SpillTokensFn, run as one chain (transforms.run.steps.UnitStepsFn). Each
    unit is a bundle of its own as far as they can tell (start_bundle, process, finish_bundle), so
    it gets spill files of its own. Side outputs (TaggedOutputs) of every step are the step's side
    outputs; ``spill``'s main outputs are its main output. A unit that was ``done`` at launch is
    not read: its marker's outputs are emitted, unless its files are gone (then it is redone).
    """

    def __init__(self, work: SavedWork, read: beam.DoFn, steps: Sequence[beam.DoFn], spill: beam.DoFn):
        super().__init__((read, *steps, spill))
        self._work = work
        self._resumed = beam.metrics.Metrics.counter("pretokenize", "units_resumed")
        self._processed = beam.metrics.Metrics.counter("pretokenize", "units_processed")

    def setup(self):
        # The steps (a tokenizer among them) are set up for the first unit that is not done: a
        # worker that only replays markers never loads them.
        super().setup()
        self._fs, self._root = storage.filesystem(self._work.url)

    def process(self, element):
        index, unit, done = element
        marker = storage.filesystem(self._work.marker_url(index))[1]
        if done:
            saved = load_marker(self._fs, marker, self._root)
            if saved is not None:
                self._resumed.inc()
                yield from saved.emit()
                return
        spill = self._fns[-1]
        main: list = []
        side: dict[str, list] = collections.defaultdict(list)
        for out in self.unit_outputs(unit):
            if isinstance(out, beam.pvalue.TaggedOutput):
                side[out.tag].append(out.value)
            else:
                main.append(out)
        # 1. The unit's files are closed (whole, or uploaded), 2. then its marker is written in one
        # piece, 3. then its outputs leave: no marker ever points at a file still being written.
        files = {path: self._fs.size(path) for path in spill.written_files()}
        saved = UnitOutputs(main, dict(side), files)
        storage.write_atomic(self._work.marker_url(index), saved.to_bytes(self._root))
        self._processed.inc()
        progress.flush_all()  # the launcher's display sees the whole unit (transforms.core.progress)
        yield from saved.emit()


class ProcessUnits(beam.PTransform):
    """Input units in (planned at launch), the spilled references and every step's side outputs out.

    Example::

        units = ProcessUnits(work, read.units, done, ReadUnitFn(read_config),
                             [FilterDocumentsFn(conds), TokenizeFn(tokenizer)],
                             SpillTokensFn(shards, bucketed_keys), tags=(DROPPED, RECORDS))
        refs, drops, records = units.refs, units[DROPPED], units[RECORDS]
    """

    def __init__(self, work: SavedWork, units: Sequence, done: set[int], read: beam.DoFn,
                 steps: Sequence[beam.DoFn], spill: beam.DoFn, tags: Sequence[str]):
        super().__init__()
        self._work = work
        self._elements = [(i, u, i in done) for i, u in enumerate(units)]
        self._fn = ProcessUnitsFn(work, read, steps, spill)
        self._tags = tuple(tags)

    def expand(self, pbegin):
        return (
            pbegin
            # A unit done at launch only replays its marker: it costs next to nothing.
            | "SpreadInputUnits" >> SpreadEvenly(self._elements, lambda e: 0 if e[2] else unit_cost(e[1]))
            | "ProcessUnits" >> beam.ParDo(self._fn).with_outputs(*self._tags, main="refs")
        )
