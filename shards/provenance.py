"""``dataset_stats.json``: what made an output tree and what it holds, for programs to read.

``dataset_stats.txt`` stays the commit point and the file the tools parse; this one says the same
counts as JSON together with what the text file never held, the tree's provenance:

    job          "bucketed" or "scaffold"
    versions     beam-pretokenize, apache-beam, Python, and the tokenizer library that encoded
    tokenizer    its spec, EOS id, vocabulary size, and the sha256 of the ranks or tokenizer files
    flags        every flag of the job (its settings), but --output (and a --workers count): a
                 tree's bytes do not depend on where it was written or by how many workers, so a
                 local run and one on a cluster write the same file
    inputs       every input file's name (a URL, or a local path as typed or below the input's
                 root, never this machine's absolute path) and its fingerprint when planned
    card         the card's Hub metadata: license, source_datasets, language
    documents    read, kept and dropped; ``drops`` by reason
    buckets      (bucketed) per length bucket: its length range, documents, tokens and files
    splits       (scaffold) per split: documents, sequences, words, tokens and files

Nothing in it depends on the run (no time, no run id, no worker count): two runs of the same
command on the same input in the same environment write the same bytes. The versions and the
inputs' fingerprints do differ between environments and copies of the input, as they should.

The jobs write it just before ``dataset_stats.txt``; ``pretokenize remove`` rewrites it from the
new counts and the provenance it already holds. Nothing here imports Beam.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath

from shards import conditions, layout, llmc, storage
from shards.manifest import DatasetStats

STATS_JSON_NAME = "dataset_stats.json"
SCHEMA = "beam-pretokenize/dataset_stats/1"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """What the launcher knows about a run that the counts do not say; fixed before it starts.

    ``tokenizer_files`` are (file name, sha256) of the files the tokenizer was built from;
    ``inputs`` (URL, fingerprint) of every input file, in the order the job read them.
    """

    job: str
    versions: dict[str, str]
    tokenizer_spec: str
    tokenizer_files: tuple[tuple[str, str], ...]
    flags: dict[str, object]
    inputs: tuple[tuple[str, str], ...]
    # The card's metadata: license, source_datasets, language (transforms.run.provenance.card_metadata).
    card: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "job": self.job,
            "versions": dict(self.versions),
            "tokenizer": {
                "spec": self.tokenizer_spec,
                "files": [{"name": n, "sha256": h} for n, h in self.tokenizer_files],
            },
            "flags": dict(self.flags),
            "inputs": [{"url": u, "fingerprint": f} for u, f in self.inputs],
            "card": dict(self.card),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Provenance:
        """The provenance part of a parsed dataset_stats.json; a ValueError when it lacks one."""
        try:
            if d["schema"] != SCHEMA:
                raise ValueError(f"schema is {d['schema']!r}, expected {SCHEMA!r}")
            tok = d["tokenizer"]
            return cls(
                job=d["job"],
                versions=dict(d["versions"]),
                tokenizer_spec=tok["spec"],
                tokenizer_files=tuple((f["name"], f["sha256"]) for f in tok["files"]),
                flags=dict(d["flags"]),
                inputs=tuple((i["url"], i["fingerprint"]) for i in d["inputs"]),
                card=dict(d.get("card") or {}),  # a tree written before the card had metadata has none
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{STATS_JSON_NAME} lacks {e}") from None


def bucketed_document(provenance: Provenance, stats: DatasetStats) -> dict:
    """The whole dataset_stats.json of a bucketed tree, as a dict (keys in the order written)."""
    doc = provenance.to_dict()
    doc["versions"]["tokenizer_library"] = stats.tokenizer_backend
    doc["tokenizer"].update(eos_id=stats.eos_id, vocab_size=stats.vocab_size, dtype=stats.dtype)
    doc["documents"] = _documents(stats.raw_documents, stats.kept_documents, stats.dropped_documents)
    doc["tokens"] = stats.total_tokens
    doc["files"] = stats.total_files
    doc["filter"] = conditions.record(stats.filter)
    doc["layout"] = {"partitions": stats.partitions, "seed": stats.seed, "dtype": stats.dtype}
    buckets = []
    for name in layout.BUCKET_NAMES:
        b = stats.buckets.get(name)
        low, high = layout.bucket_range(name)
        buckets.append({
            "bucket": name,
            "min_length": low,
            "max_length": high,
            "documents": b.documents if b else 0,
            "tokens": b.tokens if b else 0,
            "files": b.files if b else 0,
        })
    doc["buckets"] = buckets
    doc["drops"] = dict(sorted(stats.drops.items()))
    if stats.removal_list_ids is not None:
        doc["removal_list"] = {"ids": stats.removal_list_ids, "not_found": stats.removal_ids_not_found}
    return doc


def scaffold_document(provenance: Provenance, stats: llmc.ScaffoldStats, library: str | None) -> dict:
    """The whole dataset_stats.json of a scaffold (llm.c) tree, as a dict."""
    doc = provenance.to_dict()
    doc["versions"]["tokenizer_library"] = library
    doc["tokenizer"].update(eot_id=llmc.GPT2_EOT, ff_base=llmc.FF_BASE, max_token_id=llmc.MAX_TOKEN_ID,
                            dtype="uint16")
    doc["documents"] = _documents(stats.raw_documents, stats.kept_documents, stats.dropped_documents)
    doc["tokens"] = stats.total_tokens
    doc["files"] = stats.total_files
    doc["layout"] = {
        "format": llmc.STATS_FORMAT,
        "shard_tokens": stats.shard_tokens,
        "val_fraction": float(stats.val_fraction),
        "seed": stats.seed,
        "header_bytes": llmc.HEADER_BYTES,
        "magic": llmc.MAGIC,
        "version": llmc.VERSION,
    }
    doc["encoding"] = {
        "annotate": stats.annotate,
        "long_docs": stats.long_docs,
        "max_word_chars": stats.max_word_chars,
        "max_words": llmc.MAX_WORDS,
        "countdown_mismatch_documents": stats.countdown_mismatches,
    }
    doc["splits"] = [
        {"split": name, **dataclasses.asdict(stats.splits.get(name, llmc.SplitStats()))} for name in llmc.SPLITS
    ]
    doc["drops"] = dict(sorted(stats.drops.items()))
    return doc


def _documents(read: int, kept: int, dropped: int) -> dict:
    return {"read": read, "kept": kept, "dropped": dropped}


def to_bytes(doc: dict) -> bytes:
    """The file's bytes: indented, keys in the order built, ASCII only, one final newline."""
    return (json.dumps(doc, indent=1, ensure_ascii=True) + "\n").encode("ascii")


def read_document(url: str) -> dict | None:
    """A tree's dataset_stats.json parsed, or None when the tree has none."""
    fs, root = storage.filesystem(url)
    path = posixpath.join(root.rstrip("/"), STATS_JSON_NAME)
    if not fs.exists(path):
        return None
    try:
        return json.loads(storage.read_bytes(fs, path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{storage.join(url, STATS_JSON_NAME)} is not JSON: {e}") from None

