"""datatrove's reference tokenization job over the benchmark corpus, as a user of datatrove would write it.

    python tests/bench/datatrove_job.py CORPUS_DIR TOKENIZER_JSON OUTPUT_DIR

ParquetReader -> LambdaFilter (the bucketed job's filter: language, page LID, LID score >= 0.90,
token_count >= 1, non-empty text) -> DocumentTokenizer (the same vocabulary as a tokenizer.json, EOS
<|endoftext|> appended, its default batch of 10,000 documents and its per-file shuffle), on a
LocalPipelineExecutor with one task and one worker. Run it with TOKENIZERS_PARALLELISM=false for one
core. It prints one JSON line: the documents and tokens (EOS included) the tokenizer wrote.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.filters import LambdaFilter
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.tokens import DocumentTokenizer

LANGUAGE = "eng_Latn"
THRESHOLD = 0.90


def keep(doc) -> bool:
    meta = doc.metadata
    score, count = meta.get("page_average_lid_score"), meta.get("token_count")
    return (
        meta.get("language") == LANGUAGE
        and meta.get("page_average_lid") == LANGUAGE
        and score is not None
        and score >= THRESHOLD
        and count is not None
        and count >= 1
        and bool(doc.text)
    )


def main() -> None:
    corpus, tokenizer_json, output = sys.argv[1:4]
    out = Path(output)
    LocalPipelineExecutor(
        pipeline=[
            ParquetReader(corpus, glob_pattern="*.parquet", text_key="text", id_key="id"),
            LambdaFilter(keep),
            DocumentTokenizer(
                output_folder=str(out / "tokens"),
                tokenizer_name_or_path=tokenizer_json,
                eos_token="<|endoftext|>",
                local_working_dir=str(out / "work"),
                seed=0,
            ),
        ],
        tasks=1,
        workers=1,
        logging_dir=str(out / "logs"),
        skip_completed=False,
    ).run()
    index = sorted((out / "tokens").glob("*.ds.index"))
    documents = sum(p.stat().st_size // 8 for p in index)
    size = sum(p.stat().st_size for p in (out / "tokens").glob("*.ds"))
    print(json.dumps({"documents": documents, "tokens": size // 4, "files": len(index)}))


if __name__ == "__main__":
    main()
