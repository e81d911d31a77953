"""The scale rehearsal's corpus: N short documents (3 to 40 words each) in the FinePDFs parquet schema.

Issue 12 measured the job on 2,000,000 such documents (about half kept, 23.5M tokens). This builds
the same shape from real text of the checkout, so the tokenizer sees real words in real order:

    English text        a run of 3-40 consecutive words of the English sources in tests/data/sample_sources
                        (the Jargon File, SQLite docs, pydoc topics, The Devil's Dictionary, the UDHR)
    non-English text    a run of 3-40 consecutive words of one UDHR translation with spaces between words

Only the columns the bucketed job reads are written (id, text, language, page_average_lid,
page_average_lid_score, token_count), with the types of tests/data/make_sample.py's SCHEMA. The row
mix (CATEGORIES) keeps about half the rows, as in the issue:

    confident_english   language = page LID = eng_Latn, score in [0.9, 1.0]           kept
    non_english         language = page LID = the UDHR's code, score in [0.9, 1.0]    dropped: language
    low_lid_score       English, score in [0.5, 0.9)                                  dropped: lid_score
    other_page_lid      language eng_Latn, page LID another language                  dropped: page_average_lid
    token_count_0       English, token_count 0                                        dropped: token_count

``token_count`` is the estimate of corpus.py (1.3 tokens a word). Rows are spread over FILES parquet
files (zstd) in row groups of at most ROW_GROUP_ROWS rows. Every choice comes from one seeded numpy
generator and the ids are uuid5 values of the row index, so a given N and BUILDER_VERSION give the
same rows on every machine with this checkout. The corpus is built once into
``<cache>/scale-<N>-v<version>-<key>/`` (atomically) and reused while it is there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "tests" / "data" / "sample_sources"
sys.path.insert(0, str(REPO / "tests" / "data"))
from make_sample import SCHEMA  # noqa: E402

BUILDER_VERSION = 1
SEED = 20250612
DEFAULT_DOCUMENTS = 2_000_000
FILES = 8
ROW_GROUP_ROWS = 50_000  # ~6 MB of text a row group, as corpus.py's: 40 units of work for 2M documents
MIN_WORDS, MAX_WORDS = 3, 40
COLUMNS = ("text", "id", "token_count", "language", "page_average_lid", "page_average_lid_score")
SCALE_SCHEMA = pa.schema([SCHEMA.field(name) for name in COLUMNS])  # FinePDFs order and types
ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/beam-pretokenize/bench-scale-corpus")

# category -> share of the rows; only confident_english is kept by the default filter.
CATEGORIES = {
    "confident_english": 0.50,
    "non_english": 0.25,
    "low_lid_score": 0.12,
    "other_page_lid": 0.08,
    "token_count_0": 0.05,
}
ENGLISH_SOURCES = (
    "jargon_file_4.4.7.txt", "sqlite_docs_3.40.1.txt", "python_3.11.7_pydoc_topics.txt",
    "devils_dictionary_bierce.txt", "udhr_eng.txt",
)
# UDHR translations written with spaces between words -> their FinePDFs (GlotLID) code.
FOREIGN_SOURCES = {
    "udhr_fra.txt": "fra_Latn", "udhr_deu_1996.txt": "deu_Latn", "udhr_spa.txt": "spa_Latn",
    "udhr_por_PT.txt": "por_Latn", "udhr_por_BR.txt": "por_Latn", "udhr_ita.txt": "ita_Latn",
    "udhr_nld.txt": "nld_Latn", "udhr_pol.txt": "pol_Latn", "udhr_rus.txt": "rus_Cyrl",
    "udhr_ukr.txt": "ukr_Cyrl", "udhr_ell_monotonic.txt": "ell_Grek", "udhr_arb.txt": "arb_Arab",
    "udhr_hin.txt": "hin_Deva", "udhr_kor.txt": "kor_Hang", "udhr_vie.txt": "vie_Latn",
    "udhr_tur.txt": "tur_Latn",
}


def words_of(names) -> list[str]:
    """The whitespace-separated words of the named source files, in order."""
    words: list[str] = []
    for name in names:
        words += (SOURCES / name).read_text(encoding="utf-8").split()
    return words


def _runs(words: list[str], starts: np.ndarray, lengths: np.ndarray) -> list[str]:
    return [" ".join(words[s:s + n]) for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]


def build_table(rng: np.random.Generator, first: int, rows: int, english: list[str],
                foreign: list[tuple[str, list[str]]]) -> tuple[pa.Table, Counter]:
    """Rows ``first`` .. ``first + rows - 1`` of the corpus and their category counts."""
    names = list(CATEGORIES)
    category = rng.choice(len(names), size=rows, p=list(CATEGORIES.values()))
    lengths = rng.integers(MIN_WORDS, MAX_WORDS + 1, size=rows)
    english_start = rng.integers(0, len(english) - MAX_WORDS, size=rows)
    foreign_pick = rng.integers(0, len(foreign), size=rows)
    foreign_u = rng.random(rows)
    high = np.round(rng.uniform(0.9, 1.0, size=rows), 4)
    low = np.minimum(np.floor(rng.uniform(0.5, 0.9, size=rows) * 1e4) / 1e4, 0.8999)
    other_lid = rng.integers(0, len(foreign), size=rows)

    non_english = category == names.index("non_english")
    texts = _runs(english, english_start, lengths)
    language = ["eng_Latn"] * rows
    page_lid = ["eng_Latn"] * rows
    for i in np.flatnonzero(non_english).tolist():
        code, words = foreign[foreign_pick[i]]
        start = int(foreign_u[i] * (len(words) - MAX_WORDS))
        texts[i] = " ".join(words[start:start + lengths[i]])
        language[i] = page_lid[i] = code
    for i in np.flatnonzero(category == names.index("other_page_lid")).tolist():
        page_lid[i] = foreign[other_lid[i]][0]
    score = np.where(category == names.index("low_lid_score"), low, high)
    token_count = np.round(lengths * 1.3).astype(np.int64)
    token_count[category == names.index("token_count_0")] = 0
    ids = [f"<urn:uuid:{uuid.uuid5(ID_NAMESPACE, f'scale/{first + i}')}>" for i in range(rows)]
    table = pa.table(
        {
            "text": pa.array(texts, pa.string()),
            "id": pa.array(ids, pa.string()),
            "token_count": pa.array(token_count, pa.int64()),
            "language": pa.array(language, pa.string()),
            "page_average_lid": pa.array(page_lid, pa.string()),
            "page_average_lid_score": pa.array(score, pa.float64()),
        },
        schema=SCALE_SCHEMA,
    )
    return table, Counter({names[k]: int(v) for k, v in zip(*np.unique(category, return_counts=True), strict=True)})


def build(directory: Path, documents: int) -> dict:
    """Write the corpus's parquet files into ``directory`` and return its description."""
    english = words_of(ENGLISH_SOURCES)
    foreign = [(code, words_of([name])) for name, code in FOREIGN_SOURCES.items()]
    rng = np.random.default_rng(SEED)
    categories: Counter = Counter()
    text_bytes = row_groups = 0
    first = 0
    for f in range(FILES):
        rows = documents // FILES + (1 if f < documents % FILES else 0)
        if not rows:
            continue
        with pq.ParquetWriter(directory / f"part-{f:04d}.parquet", SCALE_SCHEMA, compression="zstd") as writer:
            for start in range(0, rows, ROW_GROUP_ROWS):
                n = min(ROW_GROUP_ROWS, rows - start)
                table, counts = build_table(rng, first, n, english, foreign)
                writer.write_table(table, row_group_size=n)
                categories += counts
                text_bytes += sum(len(t.encode("utf-8")) for t in table.column("text").to_pylist())
                row_groups += 1
                first += n
    return {
        "builder_version": BUILDER_VERSION,
        "seed": SEED,
        "documents": documents,
        "files": FILES,
        "row_groups": row_groups,
        "text_bytes": text_bytes,
        "categories": dict(sorted(categories.items())),
        "kept_expected": categories["confident_english"],
        "english_source_words": len(english),
        "foreign_languages": len({code for code, _ in foreign}),
    }


def ensure(cache: Path, documents: int = DEFAULT_DOCUMENTS) -> tuple[Path, dict]:
    """The corpus directory for ``documents`` rows, built (atomically) when it is not there yet."""
    if documents < 1:
        raise ValueError(f"the scale corpus needs at least one document, got {documents}")
    key = hashlib.blake2b(
        f"{BUILDER_VERSION}/{SEED}/{documents}/{FILES}/{ROW_GROUP_ROWS}".encode(), digest_size=6
    ).hexdigest()
    directory = cache / f"scale-{documents}-v{BUILDER_VERSION}-{key}"
    info_path = directory / "corpus.json"
    if info_path.is_file():
        return directory / "data", json.loads(info_path.read_text())
    tmp = cache / f".{directory.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    info = build(tmp / "data", documents)
    (tmp / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory / "data", info
