#!/usr/bin/env python3
"""Build ``tests/data/finepdfs_sample.parquet`` from ``tests/data/sample_sources/``.

The output is a small stand-in for one shard of the FinePDFs-Edu ``eng_Latn``
configuration: the same Arrow schema, real (lawfully redistributable) text, and
a deliberate mix of rows that exercises the language filter, the length
buckets and the tokenizer. Provenance and licences of every source text are in
``tests/data/README.md``.

Usage (from the repository root; needs only the standard library and pyarrow)::

    python tests/data/make_sample.py            # writes tests/data/finepdfs_sample.parquet
    python tests/data/make_sample.py --out X    # writes somewhere else

The script is deterministic: every random choice comes from
``random.Random(SEED)`` in a fixed order, ids are uuid5 values of fixed
strings, and nothing depends on the clock, the environment or dict/set order.
Running it twice with the same pyarrow version gives byte-identical files.

How the documents are made
--------------------------
* Jargon File 4.4.7 (whole, ~1.38 M characters) followed by the last ~70 K
  characters of The Devil's Dictionary: the one LONG English document
  (~1.45 M characters, ~1.49 MB), meant to land in the largest length bucket
  (> 262,144 tokens with a BPE tokenizer at ~4 characters per token).
* SQLite documentation: one document per page (pages over ~100 KB are split at
  paragraph boundaries).
* Python 3.11.7 pydoc topics: one document per topic.
* The Devil's Dictionary (minus the tail used above): cut at entry boundaries
  into chunks of varied size.
* UDHR translations: each non-English translation is cut in two at a paragraph
  boundary; first halves become "English-labelled but non-English page LID"
  rows, some second halves become rows labelled with their real language.
* Designated "feature" rows, all labelled confident English so a language
  filter keeps them and the tokenizer tests see them:
    - ``udhr-preambles``: the UDHR opening in 20 languages (accents, Cyrillic,
      Greek, Arabic, Devanagari, CJK, Hangul), with CRLF line endings;
    - ``invalidutf-cjk``: an SQLite page followed by the CPython CJK test texts;
    - ``emoji-1`` / ``emoji-2``: the Unicode emoji test data excerpt (emoji,
      ZWJ sequences, flags, digits, runs of 40+ spaces);
    - ``sqlite/quirks``: an English page with CRLF line endings;
    - ``sqlite/limits``: an English page (many digits) re-laid-out like a PDF
      text extraction: tab-indented paragraphs and a running header whose page
      number is pushed right by a run of 40 spaces.
  These transformations are the only edits made to the source texts.

Row mix (the script prints the counts; README.md lists them):
    confident English    language=page_average_lid="eng_Latn", score in [0.90, 1.0]
                         (includes the long doc, the feature rows, one row with a
                         score of exactly 0.90 and the token_count=0 rows)
    low-score English    language=page_average_lid="eng_Latn", score in [0.5, 0.9)
    eng label, other LID language="eng_Latn", page_average_lid=real code
    non-English label    language=page_average_lid=real code (!= "eng_Latn")

Fields that have no real counterpart (dump, url, date, file_path, offset,
is_truncated, extractor) are synthetic but shaped like FinePDFs values; urls
use the reserved ``.invalid`` TLD. ``page_ends`` are cumulative character
offsets of ~3000-character pseudo-pages snapped to line breaks, the last one
equal to ``len(text)``. ``per_page_languages`` gives, for each pseudo-page, the
language suggested by its dominant script (Latin pages take the row's
page_average_lid). ``token_count`` is a rough estimate:
``round(1.3 * whitespace_words + CJK/kana/hangul characters)``, at least 1,
except for the designated token_count=0 rows.
"""

from __future__ import annotations

import argparse
import datetime
import random
import re
import sys
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SEED = 20250101
HERE = Path(__file__).resolve().parent
SOURCES = HERE / "sample_sources"
DEFAULT_OUT = HERE / "finepdfs_sample.parquet"

MAX_DOC_CHARS = 100_000          # cap for ordinary documents
PAGE_CHARS = 3000                # target pseudo-page length
ROW_GROUP_SIZE = 100             # -> a few row groups in the file
MAX_PARQUET_BYTES = 5 * 1024 * 1024
ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/beam-pretokenize/sample-data")

SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("id", pa.string()),
        ("dump", pa.string()),
        ("url", pa.string()),
        ("date", pa.string()),
        ("file_path", pa.string()),
        ("offset", pa.int64()),
        ("token_count", pa.int64()),
        ("language", pa.string()),
        ("page_average_lid", pa.string()),
        ("page_average_lid_score", pa.float64()),
        ("full_doc_lid", pa.string()),
        ("full_doc_lid_score", pa.float64()),
        ("per_page_languages", pa.list_(pa.string())),
        ("is_truncated", pa.bool_()),
        ("extractor", pa.string()),
        ("page_ends", pa.list_(pa.int64())),
    ]
)

# UDHR file suffix -> FinePDFs/GlotLID-style language code
UDHR_CODES = {
    "fra": "fra_Latn", "deu_1996": "deu_Latn", "spa": "spa_Latn", "por_PT": "por_Latn",
    "por_BR": "por_Latn", "ita": "ita_Latn", "nld": "nld_Latn", "pol": "pol_Latn",
    "rus": "rus_Cyrl", "ukr": "ukr_Cyrl", "ell_monotonic": "ell_Grek", "arb": "arb_Arab",
    "hin": "hin_Deva", "cmn_hans": "cmn_Hani", "cmn_hant": "cmn_Hani", "jpn": "jpn_Jpan",
    "kor": "kor_Hang", "vie": "vie_Latn", "tur": "tur_Latn",
}
# second halves of these translations become rows labelled with the real language
UDHR_NON_ENGLISH_LABEL = ["fra", "deu_1996", "por_BR", "rus", "cmn_hans", "jpn"]
CJK_FILES = ["big5", "gb2312", "gb18030", "euc_jp", "euc_jisx0213"]

# designated rows, by (source, name)
EXACT_090 = ("sqlite", "whentouse")
TOKEN_ZERO = [("pydoc", "pass"), ("sqlite", "zeroconf")]
CRLF_PAGE = ("sqlite", "quirks")
LAYOUT_PAGE = ("sqlite", "limits")
CJK_HOST_PAGE = ("sqlite", "invalidutf")
N_LOW_SCORE = 14
LONG_DEVIL_TAIL = 70_000         # characters of The Devil's Dictionary appended to the long doc

DUMPS = ["CC-MAIN-2019-43", "CC-MAIN-2020-50", "CC-MAIN-2021-31", "CC-MAIN-2022-49",
         "CC-MAIN-2023-23", "CC-MAIN-2024-10", "CC-MAIN-2024-51"]


# ----------------------------------------------------------------------------
# reading and splitting the sources
# ----------------------------------------------------------------------------

def read_source(name: str) -> str:
    # newline="" keeps the bytes as they are; the sources are stored with LF
    with open(SOURCES / name, encoding="utf-8", newline="") as f:
        return f.read()


def split_pages(text: str) -> list[tuple[str, str]]:
    """Split a file made of '=== source-page: NAME ===' sections."""
    parts = re.split(r"^=== source-page: (.+?) ===\n", text, flags=re.M)
    assert parts[0].strip() == "", "text before the first page marker"
    out = []
    for i in range(1, len(parts), 2):
        name = re.sub(r"\.html$", "", parts[i])
        out.append((name, parts[i + 1].strip("\n") + "\n"))
    return out


def split_paragraphs_balanced(text: str, max_chars: int) -> list[str]:
    """Cut text at paragraph boundaries into pieces of at most ~max_chars."""
    if len(text) <= max_chars:
        return [text]
    n = -(-len(text) // max_chars)
    target = len(text) / n
    paras = text.split("\n\n")
    pieces, cur = [], []
    cur_len = 0
    for p in paras:
        if cur and cur_len + len(p) + 2 > target and len(pieces) < n - 1:
            pieces.append("\n\n".join(cur).strip("\n") + "\n")
            cur, cur_len = [], 0
        cur.append(p)
        cur_len += len(p) + 2
    pieces.append("\n\n".join(cur).strip("\n") + "\n")
    return pieces


def split_in_two(text: str) -> tuple[str, str]:
    """Cut text at the paragraph boundary closest to its middle."""
    mid = len(text) // 2
    cands = [m.start() for m in re.finditer(r"\n\n", text)]
    cut = min(cands, key=lambda c: abs(c - mid))
    return text[:cut].strip("\n") + "\n", text[cut:].strip("\n") + "\n"


ENTRY_START = re.compile(r"^[A-Z][A-Z'\-]*(?: [A-Z][A-Z'\-]*)*[,.]")
DEVIL_SIZES = [700, 2500, 6000, 15000, 1500, 35000, 4000, 60000, 9000, 24000]


def split_tail(text: str, min_tail: int) -> tuple[str, str]:
    """Cut text at the last entry boundary that leaves at least min_tail characters after it."""
    cands = [m.end() for m in re.finditer(r"\n\n", text)
             if len(text) - m.end() >= min_tail and ENTRY_START.match(text[m.end():])]
    cut = cands[-1]
    return text[:cut].strip("\n") + "\n", text[cut:]


def split_devil(text: str) -> list[str]:
    """Cut The Devil's Dictionary into chunks of varied size at entry boundaries."""
    paras = text.split("\n\n")
    chunks, cur, cur_len, k = [], [], 0, 0
    for p in paras:
        if cur and cur_len >= DEVIL_SIZES[k % len(DEVIL_SIZES)] and ENTRY_START.match(p):
            chunks.append("\n\n".join(cur).strip("\n") + "\n")
            cur, cur_len, k = [], 0, k + 1
        cur.append(p)
        cur_len += len(p) + 2
    chunks.append("\n\n".join(cur).strip("\n") + "\n")
    return chunks


# ----------------------------------------------------------------------------
# transformations for the designated feature rows
# ----------------------------------------------------------------------------

def to_crlf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def pdf_layout(text: str, title: str) -> str:
    """Make text look like a layout-preserving PDF extraction.

    Every paragraph gets a leading tab, list items two tabs, and every 25 lines
    a running header line 'TITLE<40 spaces>Page N' is inserted.
    """
    out, n_lines, page = [], 0, 1
    for para in text.split("\n\n"):
        if para.startswith("* "):
            para = "\t\t" + para
        else:
            para = "\t" + para
        if n_lines >= 25 or page == 1 and not out:
            out.append(f"{title}{' ' * 40}Page {page}")
            page += 1
            n_lines = 0
        out.append(para)
        n_lines += para.count("\n") + 1
    return "\n\n".join(out).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------
# per-row metadata helpers
# ----------------------------------------------------------------------------

def page_ends_for(text: str) -> list[int]:
    """Cumulative character offsets of ~PAGE_CHARS pseudo-pages."""
    ends, pos, n = [], 0, len(text)
    while n - pos > PAGE_CHARS * 1.25:
        lo, hi = pos + int(PAGE_CHARS * 0.8), pos + int(PAGE_CHARS * 1.2)
        cut = text.rfind("\n", lo, hi)
        if cut == -1:
            cut = text.rfind(" ", lo, hi)
        cut = pos + PAGE_CHARS if cut == -1 else cut + 1
        ends.append(cut)
        pos = cut
    ends.append(n)
    return ends


SCRIPT_RANGES = [
    ("Cyrl", 0x0400, 0x052F), ("Grek", 0x0370, 0x03FF), ("Arab", 0x0600, 0x06FF),
    ("Deva", 0x0900, 0x097F), ("Kana", 0x3040, 0x30FF), ("Hang", 0xAC00, 0xD7AF),
    ("Hang", 0x1100, 0x11FF), ("Hang", 0x3130, 0x318F), ("Hani", 0x4E00, 0x9FFF),
    ("Hani", 0x3400, 0x4DBF), ("Hani", 0xF900, 0xFAFF),
]
SCRIPT_DEFAULT = {"Cyrl": "rus_Cyrl", "Grek": "ell_Grek", "Arab": "arb_Arab",
                  "Deva": "hin_Deva", "Kana": "jpn_Jpan", "Hang": "kor_Hang",
                  "Hani": "cmn_Hani"}


def script_of(ch: str) -> str | None:
    o = ord(ch)
    for name, lo, hi in SCRIPT_RANGES:
        if lo <= o <= hi:
            return name
    if ch.isalpha() and o < 0x0250:
        return "Latn"
    return None


def page_language(page: str, row_lid: str) -> str:
    counts = Counter(s for s in map(script_of, page) if s)
    if not counts:
        return row_lid
    if counts["Kana"] > 0 and counts["Kana"] + counts["Hani"] >= max(counts.values()):
        dom = "Kana"                       # Japanese mixes kana and kanji
    else:
        dom = max(sorted(counts), key=lambda s: counts[s])
    if dom == "Latn":
        return row_lid if row_lid.endswith("_Latn") else "eng_Latn"
    if row_lid.endswith("_" + {"Kana": "Jpan"}.get(dom, dom)):
        return row_lid
    return SCRIPT_DEFAULT[dom]


CJK_TOKEN_SCRIPTS = {"Hani", "Kana", "Hang"}


def estimate_tokens(text: str) -> int:
    cjk = sum(1 for ch in text if script_of(ch) in CJK_TOKEN_SCRIPTS)
    return max(1, round(1.3 * len(text.split()) + cjk))


# ----------------------------------------------------------------------------
# building the documents
# ----------------------------------------------------------------------------

def build_documents() -> list[dict]:
    """Return documents as dicts: source, name, text, category, lid."""
    docs: list[dict] = []

    def add(source, name, text, category, lid="eng_Latn", feature=None):
        docs.append(dict(source=source, name=name, text=text, category=category,
                         lid=lid, feature=feature))

    # the long English document: the whole Jargon File plus the last entries
    # of The Devil's Dictionary (which are then not used elsewhere)
    devil_head, devil_tail = split_tail(read_source("devils_dictionary_bierce.txt"), LONG_DEVIL_TAIL)
    add("jargon", "jargon-file-4.4.7", read_source("jargon_file_4.4.7.txt") + "\n" + devil_tail,
        "english", feature="long")

    # SQLite pages
    sqlite_pages = dict(split_pages(read_source("sqlite_docs_3.40.1.txt")))
    for name, text in sqlite_pages.items():
        if (("sqlite", name)) == CJK_HOST_PAGE:
            continue                                  # used in the invalidutf-cjk row
        feature = None
        if ("sqlite", name) == CRLF_PAGE:
            text, feature = to_crlf(text), "crlf"
        elif ("sqlite", name) == LAYOUT_PAGE:
            text, feature = pdf_layout(text, "SQLite Documentation: Limits In SQLite"), "layout"
        pieces = split_paragraphs_balanced(text, MAX_DOC_CHARS)
        for i, piece in enumerate(pieces):
            add("sqlite", name if len(pieces) == 1 else f"{name}-part{i + 1}", piece, "english",
                feature=feature)

    # pydoc topics
    for name, text in split_pages(read_source("python_3.11.7_pydoc_topics.txt")):
        add("pydoc", name, text, "english")

    # The Devil's Dictionary
    for i, chunk in enumerate(split_devil(devil_head)):
        add("devil", f"chunk-{i + 1:02d}", chunk, "english")

    # UDHR: English whole; others cut in two
    udhr_eng = read_source("udhr_eng.txt")
    add("udhr", "eng", udhr_eng, "english")
    translations = {code: read_source(f"udhr_{code}.txt") for code in UDHR_CODES}
    for code, lid in UDHR_CODES.items():
        first, second = split_in_two(translations[code])
        add("udhr", f"{code}-part1", first, "eng_label_other_lid", lid=lid)
        if code in UDHR_NON_ENGLISH_LABEL:
            add("udhr", f"{code}-part2", second, "non_english", lid=lid)

    # feature row: the UDHR opening in 20 languages, CRLF line endings
    blocks = []
    for code, text in [("eng", udhr_eng)] + list(translations.items()):
        paras = [p for p in text.split("\n\n") if p.strip()]
        blocks.append(f"[{code}]\n" + "\n\n".join(paras[:3]))
    add("udhr", "udhr-preambles", to_crlf("\n\n".join(blocks) + "\n"), "english", feature="multilingual+crlf")

    # feature row: an English page about UTF-8 followed by the CPython CJK texts
    cjk = [f"[{n}-utf8.txt]\n" + read_source(f"cpython_cjkencodings_{n}-utf8.txt").strip("\n")
           for n in CJK_FILES]
    add("sqlite", "invalidutf-cjk", sqlite_pages[CJK_HOST_PAGE[1]] + "\n" + "\n\n".join(cjk) + "\n",
        "english", feature="cjk")

    # feature rows: the emoji test data excerpt, in two parts
    emoji = read_source("unicode_emoji-test_15.0_excerpt.txt")
    cut = emoji.index("# group: People & Body")
    add("unicode", "emoji-1", emoji[:cut].rstrip("\n") + "\n", "english", feature="emoji")
    add("unicode", "emoji-2", emoji[cut:], "english", feature="emoji")
    return docs


def build_rows(docs: list[dict]) -> tuple[list[dict], Counter]:
    rng = random.Random(SEED)
    mix: Counter = Counter()

    # choose the low-score English rows among plain English documents
    plain = [i for i, d in enumerate(docs)
             if d["category"] == "english" and d["feature"] is None
             and (d["source"], d["name"]) not in [EXACT_090, *TOKEN_ZERO]]
    low = set(rng.sample(plain, N_LOW_SCORE))
    low_scores = [0.5, 0.8999] + [round(rng.uniform(0.5, 0.8999), 4) for _ in range(N_LOW_SCORE - 2)]

    rows = []
    for i, d in enumerate(docs):
        text, key = d["text"], (d["source"], d["name"])
        lid = d["lid"]
        if d["category"] == "english" and i in low:
            category = "english_low_score"
            score = low_scores.pop(0)
        elif d["category"] == "english":
            category = "english_confident"
            score = 0.9 if key == EXACT_090 else round(rng.uniform(0.9, 1.0), 4)
        elif d["category"] == "eng_label_other_lid":
            category = "eng_label_other_lid"
            score = round(rng.uniform(0.6, 0.99), 4)
        else:
            category = "non_english"
            score = round(rng.uniform(0.9, 1.0), 4)
        language = lid if category == "non_english" else "eng_Latn"
        full_doc_score = round(min(1.0, max(0.0, score + rng.uniform(-0.03, 0.03))), 4)

        ends = page_ends_for(text)
        starts = [0] + ends[:-1]
        per_page = [page_language(text[s:e], lid) for s, e in zip(starts, ends, strict=True)]

        dump = DUMPS[rng.randrange(len(DUMPS))]
        # a crawl date inside the dump's ISO week (CC-MAIN-YYYY-WW)
        day = datetime.date.fromisocalendar(int(dump[8:12]), int(dump[13:15]), rng.randint(1, 7))
        date = (f"{day.isoformat()}T"
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")
        segment = f"{rng.randint(1_500_000_000_000, 1_750_000_000_000)}.{rng.randint(0, 99)}"
        file_path = (f"s3://commoncrawl/crawl-data/{dump}/segments/{segment}/warc/"
                     f"{dump}-{rng.randint(10**13, 10**14 - 1)}-{rng.randint(0, 99999):05d}.warc.gz")
        uid = uuid.uuid5(ID_NAMESPACE, f"{d['source']}/{d['name']}/{i}")
        token_count = 0 if key in TOKEN_ZERO else estimate_tokens(text)

        rows.append(dict(
            text=text,
            id=f"<urn:uuid:{uid}>",
            dump=dump,
            url=f"https://finepdfs-sample.invalid/{d['source']}/{d['name']}.pdf",
            date=date,
            file_path=file_path,
            offset=rng.randrange(0, 1 << 30),
            token_count=token_count,
            language=language,
            page_average_lid=lid if category in ("eng_label_other_lid", "non_english") else "eng_Latn",
            page_average_lid_score=score,
            full_doc_lid=lid,
            full_doc_lid_score=full_doc_score,
            per_page_languages=per_page,
            is_truncated=rng.random() < 0.08,
            extractor="rolmOCR" if rng.random() < 0.2 else "docling",
            page_ends=ends,
        ))
        mix[category] += 1
        if token_count == 0:
            mix["  of which token_count == 0"] += 1
        if score == 0.9:
            mix["  of which page_average_lid_score == 0.90"] += 1
        if d["feature"]:
            mix[f"  of which feature row: {d['feature']}"] += 1

    rng.shuffle(rows)
    return rows, mix


def check(rows: list[dict], mix: Counter) -> list[str]:
    """The properties the tests rely on; returns a list of violations."""
    errors = []

    def need(cond, msg):
        if not cond:
            errors.append(msg)

    need(150 <= len(rows) <= 400, f"row count {len(rows)} not in [150, 400]")
    need(len({r["id"] for r in rows}) == len(rows), "ids are not unique")
    need(mix["eng_label_other_lid"] >= 10, "fewer than 10 eng-labelled rows with another page LID")
    need(mix["non_english"] >= 3, "fewer than 3 non-English-labelled rows")
    need(mix["english_low_score"] >= 10, "fewer than 10 low-score English rows")
    need(sum(r["token_count"] == 0 for r in rows) >= 2, "fewer than 2 rows with token_count 0")
    conf = [r for r in rows if r["language"] == r["page_average_lid"] == "eng_Latn"
            and r["page_average_lid_score"] >= 0.9]
    need(any(r["page_average_lid_score"] == 0.9 for r in conf), "no confident row scored exactly 0.90")
    long = [r for r in rows if len(r["text"]) > MAX_DOC_CHARS]
    need(len(long) == 1 and 1_200_000 <= len(long[0]["text"].encode()) <= 1_500_000 and long[0] in conf,
         "expected exactly one confident English document of 1.2-1.5 MB")
    for what, pat in [("CRLF", "\r\n"), ("40-space run", " " * 40), ("tab", "\t")]:
        need(any(pat in r["text"] for r in conf), f"no confident English row with a {what}")
    for what, rx in [("emoji", "[\U0001F300-\U0001FAFF]"), ("CJK", "[\u4e00-\u9fff]"),
                     ("accented letter", "[\u00e0-\u00ff]"), ("digit", "[0-9]")]:
        need(any(re.search(rx, r["text"]) for r in conf), f"no confident English row with a {what}")
    for r in rows:
        pe = r["page_ends"]
        if not (pe and pe[-1] == len(r["text"]) and all(a < b for a, b in zip([0] + pe, pe, strict=False))
                and len(r["per_page_languages"]) == len(pe)):
            errors.append(f"bad page_ends for {r['url']}")
    return errors


def write_parquet(rows: list[dict], out: Path) -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, out, compression="zstd", row_group_size=ROW_GROUP_SIZE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output parquet path")
    args = ap.parse_args(argv)

    rows, mix = build_rows(build_documents())
    write_parquet(rows, args.out)

    size = args.out.stat().st_size
    lengths = sorted(len(r["text"]) for r in rows)
    print(f"wrote {args.out} ({size:,} bytes, {len(rows)} rows)")
    print(f"text length: min {lengths[0]:,}, median {lengths[len(lengths) // 2]:,}, "
          f"max {lengths[-1]:,} characters")
    print("row mix:")
    for k in ["english_confident", "english_low_score", "eng_label_other_lid", "non_english"]:
        print(f"  {k:<22} {mix[k]}")
    for k in sorted(k for k in mix if k.startswith("  of which")):
        print(f"  {k.strip()}: {mix[k]}")
    langs = Counter((r["language"], r["page_average_lid"]) for r in rows)
    print("(language, page_average_lid) counts:")
    for (lang, lid), n in sorted(langs.items()):
        print(f"  {lang:<9} {lid:<9} {n}")
    errors = check(rows, mix)
    if size > MAX_PARQUET_BYTES:
        errors.append(f"parquet is larger than {MAX_PARQUET_BYTES} bytes")
    for e in errors:
        print(f"ERROR: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
