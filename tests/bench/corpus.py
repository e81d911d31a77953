"""The benchmark corpus: real text found on this machine, written in the FinePDFs parquet schema.

Sources (whatever of them the machine has; the corpus records what it used):

    debian-doc      /usr/share/doc: READMEs, changelogs (gzip), copyright files, HTML and PostScript manuals
    man             /usr/share/man: troff sources, English and ~25 translations
    python          the Python standard library's .py files (docstrings, comments and code)
    sample-sources  tests/data/sample_sources: the UDHR in 20 languages, CJK texts, the Jargon File

Every file is decoded as UTF-8 (files that are not are skipped), exact duplicates are dropped, and
files under ``MIN_CHARS`` are skipped. A file over ``MAX_DOC_CHARS`` is cut at line breaks into
documents of at most that size, so documents run from a few hundred characters to several MB.
Every file of at least ``ALWAYS_CHARS`` is taken (they are the long tail a PDF corpus has); the rest
are drawn in a seeded random order until the corpus holds ``target_mb`` MB of text.

The row mix imitates a FinePDFs-Edu shard before filtering (the job drops every row that is not
confident English, and the counts say why):

    non-English         translated man pages and UDHR translations, labelled with their language
    low LID score       LOW_SCORE_SHARE of the English rows, page_average_lid_score in [0.5, 0.9)
    other page LID      OTHER_LID_SHARE of the English rows: language eng_Latn, page LID another one
    token_count 0       ZERO_COUNT_SHARE of the English rows
    confident English   the rest: score in [0.9, 1.0]

The ``x3`` corpus is the base corpus three times over under fresh ids, in another row order: the
same documents, three times the rows and bytes, for the memory-does-not-grow check.

Everything is deterministic for a given machine (sorted walks, one seeded generator, uuid5 ids).
The corpus is built into a cache directory keyed by its parameters and reused while it is there.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import sys
import sysconfig
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "data"))
from make_sample import DUMPS, SCHEMA, page_ends_for  # noqa: E402

BUILDER_VERSION = 1
SEED = 20250601
MIN_CHARS = 300
MAX_DOC_CHARS = 6_000_000
ALWAYS_CHARS = 1_000_000
LOW_SCORE_SHARE = 0.08
OTHER_LID_SHARE = 0.04
ZERO_COUNT_SHARE = 0.01
ROW_GROUP_TEXT_BYTES = 6_000_000  # a row group holds about this much text: ~30 units of work per 160 MB
FILE_TEXT_BYTES = 48_000_000
ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/beam-pretokenize/bench-corpus")

# man/<dir> -> the FinePDFs (GlotLID) code of its language
MAN_LANGUAGES = {
    "cs": "ces_Latn", "da": "dan_Latn", "de": "deu_Latn", "es": "spa_Latn", "fi": "fin_Latn",
    "fr": "fra_Latn", "hr": "hrv_Latn", "hu": "hun_Latn", "id": "ind_Latn", "it": "ita_Latn",
    "ja": "jpn_Jpan", "ko": "kor_Hang", "nl": "nld_Latn", "pl": "pol_Latn", "pt": "por_Latn",
    "pt_BR": "por_Latn", "ro": "ron_Latn", "ru": "rus_Cyrl", "sl": "slv_Latn", "sr": "srp_Cyrl",
    "sv": "swe_Latn", "tr": "tur_Latn", "uk": "ukr_Cyrl", "zh_CN": "cmn_Hani", "zh_TW": "cmn_Hant",
}
UDHR_LANGUAGES = {
    "fra": "fra_Latn", "deu_1996": "deu_Latn", "spa": "spa_Latn", "por_PT": "por_Latn", "por_BR": "por_Latn",
    "ita": "ita_Latn", "nld": "nld_Latn", "pol": "pol_Latn", "rus": "rus_Cyrl", "ukr": "ukr_Cyrl",
    "ell_monotonic": "ell_Grek", "arb": "arb_Arab", "hin": "hin_Deva", "cmn_hans": "cmn_Hani",
    "cmn_hant": "cmn_Hani", "jpn": "jpn_Jpan", "kor": "kor_Hang", "vie": "vie_Latn", "tur": "tur_Latn",
}
OTHER_LIDS = sorted(set(MAN_LANGUAGES.values()))
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@dataclasses.dataclass(frozen=True)
class SourceFile:
    source: str
    path: Path
    language: str  # eng_Latn for English sources


def _walk(root: Path, suffixes: tuple[str, ...] | None = None) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or (suffixes and not name.endswith(suffixes)):
                continue
            yield path


def source_files() -> list[SourceFile]:
    """Every candidate file, in a fixed order."""
    files: list[SourceFile] = []
    for path in _walk(Path("/usr/share/doc")):
        files.append(SourceFile("debian-doc", path, "eng_Latn"))
    man = Path("/usr/share/man")
    if man.is_dir():
        for sub in sorted(p for p in man.iterdir() if p.is_dir()):
            language = "eng_Latn" if sub.name.startswith("man") else MAN_LANGUAGES.get(sub.name)
            if language:
                files += [SourceFile("man", p, language) for p in _walk(sub)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files += [SourceFile("python", p, "eng_Latn") for p in _walk(stdlib, (".py",)) if "site-packages" not in p.parts]
    samples = REPO / "tests" / "data" / "sample_sources"
    for path in _walk(samples, (".txt",)):
        code = path.stem[len("udhr_"):] if path.stem.startswith("udhr_") else None
        files.append(SourceFile("sample-sources", path, UDHR_LANGUAGES.get(code, "eng_Latn")))
    return files


def read_text(path: Path) -> str | None:
    """The file as text (gunzipped), or None when it is not UTF-8 text."""
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    if "\x00" in text:
        return None
    return text


def split_long(text: str, limit: int = MAX_DOC_CHARS) -> list[str]:
    """Cut at line breaks into pieces of at most ``limit`` characters (balanced)."""
    if len(text) <= limit:
        return [text]
    n = -(-len(text) // limit)
    size = -(-len(text) // n)
    pieces, start = [], 0
    while len(text) - start > limit:
        cut = text.rfind("\n", start + size // 2, start + size)
        cut = start + size if cut < 0 else cut + 1
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def estimate_tokens(text: str) -> int:
    return max(1, round(1.3 * len(text.split()) + len(CJK.findall(text))))


def collect_documents(target_bytes: int, rng: random.Random) -> list[dict]:
    """Documents (source, name, language, text) of real text, about ``target_bytes`` of UTF-8."""
    files = source_files()
    seen: set[bytes] = set()
    loaded = []
    for f in files:
        text = read_text(f.path)
        if text is None or len(text) < MIN_CHARS:
            continue
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if digest in seen:
            continue
        seen.add(digest)
        loaded.append((f, text))
    big = [item for item in loaded if len(item[1]) >= ALWAYS_CHARS]
    rest = [item for item in loaded if len(item[1]) < ALWAYS_CHARS]
    rng.shuffle(rest)
    docs, total = [], 0
    for f, text in big + rest:
        if total >= target_bytes:
            break
        for i, piece in enumerate(split_long(text)):
            name = str(f.path) if len(piece) == len(text) else f"{f.path}#part{i + 1}"
            docs.append({"source": f.source, "name": name, "language": f.language, "text": piece})
            total += len(piece.encode("utf-8"))
    return docs


def make_row(doc: dict, index: int, rng: random.Random, copy: int = 0) -> tuple[dict, str]:
    """One FinePDFs-schema row for ``doc`` and its category."""
    text, lid = doc["text"], doc["language"]
    token_count = estimate_tokens(text)
    if lid != "eng_Latn":
        category, language, page_lid, score = "non_english", lid, lid, rng.uniform(0.9, 1.0)
    else:
        u = rng.random()
        language = page_lid = "eng_Latn"
        score = rng.uniform(0.9, 1.0)
        if u < LOW_SCORE_SHARE:
            category, score = "low_lid_score", rng.uniform(0.5, 0.9)
        elif u < LOW_SCORE_SHARE + OTHER_LID_SHARE:
            category, page_lid = "other_page_lid", rng.choice(OTHER_LIDS)
        elif u < LOW_SCORE_SHARE + OTHER_LID_SHARE + ZERO_COUNT_SHARE:
            category, token_count = "token_count_0", 0
        else:
            category = "confident_english"
    ends = page_ends_for(text)
    dump = DUMPS[rng.randrange(len(DUMPS))]
    uid = uuid.uuid5(ID_NAMESPACE, f"{doc['source']}/{doc['name']}/{index}/{copy}")
    row = {
        "text": text,
        "id": f"<urn:uuid:{uid}>",
        "dump": dump,
        "url": f"https://bench-corpus.invalid/{doc['source']}/{index}.pdf",
        "date": f"{dump[8:12]}-01-01T00:00:00Z",
        "file_path": f"s3://commoncrawl/crawl-data/{dump}/segments/0/warc/{index:08d}.warc.gz",
        "offset": rng.randrange(0, 1 << 30),
        "token_count": token_count,
        "language": language,
        "page_average_lid": page_lid,
        "page_average_lid_score": round(score, 4),
        "full_doc_lid": lid,
        "full_doc_lid_score": round(min(1.0, score + 0.01), 4),
        "per_page_languages": [page_lid] * len(ends),
        "is_truncated": rng.random() < 0.08,
        "extractor": "rolmOCR" if rng.random() < 0.2 else "docling",
        "page_ends": ends,
    }
    return row, category


def write_rows(rows: list[dict], directory: Path) -> int:
    """Parquet files of about FILE_TEXT_BYTES, row groups of about ROW_GROUP_TEXT_BYTES; the file count."""
    directory.mkdir(parents=True)
    files, writer, file_bytes, group, group_bytes = 0, None, 0, [], 0

    def flush_group():
        nonlocal group, group_bytes
        if group:
            writer.write_table(pa.Table.from_pylist(group, schema=SCHEMA), row_group_size=len(group))
        group, group_bytes = [], 0

    for row in rows:
        if writer is None:
            writer = pq.ParquetWriter(directory / f"part-{files:04d}.parquet", SCHEMA, compression="zstd")
            files += 1
        size = len(row["text"].encode("utf-8"))
        group.append(row)
        group_bytes += size
        file_bytes += size
        if group_bytes >= ROW_GROUP_TEXT_BYTES:
            flush_group()
        if file_bytes >= FILE_TEXT_BYTES:
            flush_group()
            writer.close()
            writer, file_bytes = None, 0
    if writer is not None:
        flush_group()
        writer.close()
    return files


def _percentiles(values: list[int]) -> dict[str, int]:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"min": values[0], "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": values[-1]}


def build(directory: Path, target_mb: float) -> dict:
    """Write ``directory``/base and ``directory``/x3 and return the corpus description."""
    rng = random.Random(SEED)
    docs = collect_documents(int(target_mb * 1e6), rng)
    rows, categories = [], Counter()
    for i, doc in enumerate(docs):
        row, category = make_row(doc, i, rng)
        rows.append(row)
        categories[category] += 1
    order = list(range(len(rows)))
    rng.shuffle(order)
    base_rows = [rows[i] for i in order]
    base_files = write_rows(base_rows, directory / "base")
    copies = []
    for copy in range(3):
        for row in rows:
            fresh = dict(row)
            fresh["id"] = f"<urn:uuid:{uuid.uuid5(ID_NAMESPACE, row['id'] + f'/copy{copy}')}>"
            copies.append(fresh)
    rng.shuffle(copies)
    x3_files = write_rows(copies, directory / "x3")
    text_bytes = [len(r["text"].encode("utf-8")) for r in rows]
    return {
        "builder_version": BUILDER_VERSION,
        "target_mb": target_mb,
        "documents": len(rows),
        "text_bytes": sum(text_bytes),
        "text_chars": sum(len(r["text"]) for r in rows),
        "document_bytes": _percentiles(text_bytes),
        "categories": dict(sorted(categories.items())),
        "source_documents": dict(sorted(Counter(d["source"] for d in docs).items())),
        "source_text_bytes": {
            s: sum(len(d["text"].encode("utf-8")) for d in docs if d["source"] == s)
            for s in sorted({d["source"] for d in docs})
        },
        "non_english_languages": len({d["language"] for d in docs} - {"eng_Latn"}),
        "base_files": base_files,
        "x3_files": x3_files,
    }


def ensure(cache: Path, target_mb: float) -> tuple[Path, dict]:
    """The corpus directory for these parameters, built (atomically) when it is not there yet."""
    key = hashlib.blake2b(f"{BUILDER_VERSION}/{SEED}/{target_mb:g}".encode(), digest_size=6).hexdigest()
    directory = cache / f"corpus-{target_mb:g}mb-{key}"
    info_path = directory / "corpus.json"
    if info_path.is_file():
        return directory, json.loads(info_path.read_text())
    tmp = cache / f".{directory.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = build(tmp, target_mb)
    (tmp / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory, info
