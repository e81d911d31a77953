"""The bundled FinePDFs sample in two other shapes, for the FineWeb and plain-JSONL commands of docs/inputs.md.

    python tests/data/reshape_sample.py out/shapes

writes, from tests/data/finepdfs_sample.parquet (same documents, same order):

- ``fineweb.parquet``: FineWeb's columns and types (text, id, dump, url, date, file_path,
  language as an ISO 639-1 code, language_score, token_count); the score is the sample's
  page_average_lid_score.
- ``plain.jsonl``: one ``{"id": ..., "text": ...}`` object a line, nothing else.

Standard library and pyarrow only; deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SAMPLE = Path(__file__).resolve().parent / "finepdfs_sample.parquet"
# FinePDFs' language codes as FineWeb's fastText codes spell them.
ISO_639_1 = {"eng_Latn": "en", "por_Latn": "pt", "fra_Latn": "fr", "jpn_Jpan": "ja", "deu_Latn": "de",
             "cmn_Hani": "zh", "rus_Cyrl": "ru"}
FINEWEB_SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()), ("date", pa.string()),
    ("file_path", pa.string()), ("language", pa.string()), ("language_score", pa.float64()),
    ("token_count", pa.int64()),
])


def main(out_dir: str) -> None:
    rows = pq.read_table(SAMPLE).to_pylist()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fineweb = [{"text": r["text"], "id": r["id"], "dump": r["dump"], "url": r["url"], "date": r["date"],
                "file_path": r["file_path"], "language": ISO_639_1[r["language"]],
                "language_score": r["page_average_lid_score"], "token_count": r["token_count"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(fineweb, FINEWEB_SCHEMA), out / "fineweb.parquet")
    with open(out / "plain.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n")
    print(f"{out / 'fineweb.parquet'}: {len(fineweb)} rows; {out / 'plain.jsonl'}: {len(rows)} lines")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/data/reshape_sample.py OUT_DIR")
    main(sys.argv[1])
