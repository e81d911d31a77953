"""Build the Portuguese scaffold sample from the UDHR texts in ../sample_sources/.

    python tests/data/scaffold/make_scaffold_sample.py            # rewrites the files beside this script
    python tests/data/scaffold/make_scaffold_sample.py --out DIR  # writes them to DIR

Deterministic: no clock, no randomness; the same sources give byte-identical files. It needs the
package installed (it annotates with the job's own --annotate rule, transforms.scaffold.annotate).
See README.md beside it for what each record is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE.parent / "sample_sources"
VARIANTS = (("por_BR", "udhr_por_BR.txt"), ("por_PT", "udhr_por_PT.txt"))

# Records of the annotated file whose markers are deliberately not what the job would write.
MISCOUNTED_ID = "udhr-por_PT-art03"  # every countdown one too high: a mismatch the job counts
# A synthetic record (not UDHR text): '<' and '>' inside words, which must stay text.
ANGLE_RECORD = {
    "id": "sinais-menor-maior",
    "words": ["Se", "1<2", "e", "3>2", ",", "então", "<b>", "não", "é", "tag", "."],
}


def paragraphs(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def article_number(numeral: str) -> int:
    """1.º style (pt-PT) or Roman (pt-BR: Artigo XXIV.)."""
    if numeral.isdigit():
        return int(numeral)
    values = {"I": 1, "V": 5, "X": 10, "L": 50}
    total = 0
    for i, c in enumerate(numeral):
        v = values[c]
        total += -v if i + 1 < len(numeral) and values[numeral[i + 1]] > v else v
    return total


def records_of(variant: str, paras: list[str]) -> list[tuple[str, str]]:
    """(id, text): the preamble, then one record per article (its heading and paragraphs)."""
    title, rest = paras[0], paras[1:]
    out: list[tuple[str, str]] = []
    current_id, current = f"udhr-{variant}-preambulo", [title]
    for p in rest:
        m = re.match(r"^Artigo ([0-9]+|[IVXL]+)\b", p)
        if m:
            out.append((current_id, "\n\n".join(current)))
            current_id, current = f"udhr-{variant}-art{article_number(m.group(1)):02d}", [p]
        else:
            current.append(p)
    out.append((current_id, "\n\n".join(current)))
    return out


def content_ff(words: list[str], offset: int = 0) -> str:
    n = len(words)
    return " ".join(f"<ff_{n - 1 - i + offset}> {w}" for i, w in enumerate(words))


def build() -> tuple[list[dict], list[dict]]:
    from transforms.scaffold.encode import annotate

    plain: list[tuple[str, str]] = []
    for variant, name in VARIANTS:
        paras = paragraphs(SOURCES / name)
        plain += records_of(variant, paras)
        if variant == "por_BR":
            # The whole declaration as one document: over 1,000 words, for --long-docs.
            plain.append((f"udhr-{variant}-integral", "\n\n".join(paras)))
    plain_rows = [{"id": doc_id, "text": text} for doc_id, text in plain]
    annotated_rows = []
    for doc_id, text in plain:
        offset = 1 if doc_id == MISCOUNTED_ID else 0
        annotated_rows.append({"id": doc_id, "content-ff": content_ff(annotate(text), offset)})
    annotated_rows.append({"id": ANGLE_RECORD["id"], "content-ff": content_ff(ANGLE_RECORD["words"])})
    return plain_rows, annotated_rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    from transforms.scaffold.encode import annotate

    plain, annotated = build()
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "por_plain.jsonl", plain)
    write_jsonl(args.out / "por_annotated.jsonl", annotated)
    words = {r["id"]: len(annotate(r["text"])) for r in plain}
    long_docs = [i for i, n in words.items() if n > 1000]
    print(f"{len(plain)} plain records, {len(annotated)} annotated records; {sum(words.values())} words; "
          f"over 1,000 words: {long_docs} ({[words[i] for i in long_docs]})")
    if len(long_docs) != 1 or not 40 <= len(plain) <= 80:
        print("the sample no longer has the shape its tests expect", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
