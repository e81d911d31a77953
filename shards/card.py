"""``README.md``: a dataset card written into every output tree, from its dataset_stats.json alone.

The card has the shape of a published Hugging Face dataset card: metadata, an at-a-glance table,
how the tree was made, statistics per bucket (or split), the layout and the file format, reading
snippets that use this tree's dtype and EOS, what to do with a removal request, and the versions
and flags that made it. Every figure comes from dataset_stats.json, so the card is rewritten
whenever that file is (each publish, each ``pretokenize remove``) and never disagrees with it.

The snippets in the ``Reading it`` section run as written from the tree's directory (a test runs
them); the ones that decode to text need the tokenizer's own library.

Nothing here imports Beam.
"""

from __future__ import annotations

import json
import logging
import re
import shlex

from shards import conditions, kinds, layout, llmc, storage, tree
from shards.layout import REMOVALS_NAME
from shards.provenance import STATS_JSON_NAME, to_bytes
from shards.tokenizer_spec import parse_spec

log = logging.getLogger(__name__)

CARD_NAME = "README.md"
# Input files named one by one in the card; all of them are in dataset_stats.json.
CARD_INPUTS = 10


def description_files(doc: dict) -> dict[str, bytes]:
    """The files a tree's description is written as: dataset_stats.json and this card."""
    return {STATS_JSON_NAME: to_bytes(doc), CARD_NAME: render(doc).encode("utf-8")}


def render(doc: dict) -> str:
    """The card of the tree dataset_stats.json ``doc`` describes."""
    parts = kinds.get(doc["job"]).part("card")(doc)  # the template of the kind named in it
    return "\n".join(parts).rstrip("\n") + "\n"


# --- figures --------------------------------------------------------------------------------------


def n(value: int) -> str:
    return f"{value:,}"


def share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:,.2f} {unit}"
    return f"{num_bytes:,} bytes"


def size_category(count: int) -> str:
    """Hugging Face's size_categories value for ``count`` rows."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
              (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"),
              (10_000_000_000, "1B<n<10B"), (100_000_000_000, "10B<n<100B"), (1_000_000_000_000, "100B<n<1T")]
    return next((name for bound, name in bounds if count < bound), "n>1T")


def command(doc: dict) -> str:
    """The job's command line from its recorded flags (--output left out, as it is in the record)."""
    words = ["pretokenize", doc["job"]]
    for name, value in doc["flags"].items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, (list, tuple)):  # a repeatable flag (--keep), given once per value
            for v in value:
                words += [flag, _shell_word(str(v))]
        else:
            words += [flag, _shell_word(str(value))]
    words += ["--output", "DIR"]
    return " ".join(words)


def _shell_word(text: str) -> str:
    """``text`` as one word of the command, on its line: quoted as shlex does, or, when it is not
    one line of text (conditions.one_line: an input file's name may hold a line break), in bash's
    $'...' with each such character escaped, so the block still says it whole and exactly (a
    carriage return, pasted from a rendered page, would otherwise come back as a line feed)."""
    if conditions.one_line(text):
        return shlex.quote(text)
    return "$'" + "".join(_escaped(c) for c in text) + "'"


def _escaped(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if conditions.one_line(c):
        return c
    # Its bytes, each as \xHH: bash's \uHHHH gives the character only in a locale that has it (under
    # LC_ALL=C, the six characters). A byte that is not UTF-8 is kept by Python as a surrogate.
    return "".join(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogateescape"))


def _front_matter(doc: dict, pretty_name: str, tags: list[str]) -> list[str]:
    lines = ["---", f"pretty_name: {pretty_name}"]
    # The Hub's metadata: a licence (the Hub flags a card without one), the sources, the languages.
    card = doc.get("card") or {}
    lines.append(f"license: {_yaml_scalar(card.get('license') or 'unknown')}")
    for key in ("language", "source_datasets"):
        if card.get(key):
            lines += [f"{key}:"] + [f"- {_yaml_scalar(v)}" for v in card[key]]
    lines.append("tags:")
    lines += [f"- {t}" for t in tags]
    lines += ["size_categories:", f"- {size_category(doc['documents']['kept'])}"]
    # The files are raw token ids, not a table the Hub's viewer could show.
    lines += ["viewer: false", "---", ""]
    return lines


def _yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar: plain when it reads back as the same string, else quoted."""
    plain = str(value)
    if plain and all(c.isalnum() or c in "-_./" for c in plain) and plain[0] not in "-." and \
            plain.lower() not in ("yes", "no", "true", "false", "null", "on", "off", "~"):
        return plain
    return json.dumps(plain)  # a JSON string is a YAML double-quoted scalar


def _input_line(doc: dict) -> str:
    inputs = doc["inputs"]
    if not inputs:
        return "none"
    first = code(inputs[0]["url"])
    return first if len(inputs) == 1 else f"{n(len(inputs))} files (the first: {first})"


def _drops_table(doc: dict) -> list[str]:
    drops = doc["drops"]
    if not drops:
        return ["No document was dropped.", ""]
    lines = ["Documents left out, by reason:", "", "| Reason | Documents |", "|---|---:|"]
    lines += [f"| {conditions.code_span(reason)} | {n(count)} |" for reason, count in drops.items()]
    lines += [f"| **Total** | **{n(sum(drops.values()))}** |", ""]
    return lines


def _provenance(doc: dict) -> list[str]:
    v = doc["versions"]
    tok = doc["tokenizer"]
    lines = [
        "## Provenance",
        "",
        "| | |",
        "|---|---|",
        f"| **Tool** | beam-pretokenize {v['beam-pretokenize']} (`pretokenize {doc['job']}`) |",
        f"| **Runtime** | Apache Beam {v['apache-beam']}, Python {v['python']} |",
        f"| **Tokenizer** | {_cell(code(tok['spec']))}, encoded by "
        f"{v.get('tokenizer_library') or 'an unrecorded library'} |",
    ]
    for f in tok["files"]:
        lines.append(f"| **sha256 of {_cell(code(f['name']))}** | {_cell(code(f['sha256']))} |")
    lines += [
        "",
        "The command that made it, with every flag of the job spelled out (`--output` is not recorded: the",
        "tree's bytes do not depend on where it was written; runner flags such as `--runner` are Beam's and",
        "change nothing in the output):",
        "",
        *fenced("bash", [command(doc)]),
        "",
    ]
    inputs = doc["inputs"]
    lines += [f"Input files ({n(len(inputs))}), each with its size and version when the job was planned:", ""]
    lines += [f"- {code(i['url'])} ({i['fingerprint']})" for i in inputs[:CARD_INPUTS]]
    if len(inputs) > CARD_INPUTS:
        lines.append(f"- … and {n(len(inputs) - CARD_INPUTS)} more, all listed in `{STATS_JSON_NAME}`")
    lines += ["", f"`{STATS_JSON_NAME}` holds all of this, and the counts above, for programs to read.", ""]
    return lines


# --- the bucketed layout ---------------------------------------------------------------------------


def _kept_when(flags: dict, filt: dict) -> list[str]:
    """The filter's conditions as the run applied them (shards.conditions), from its recorded flags
    and filter settings (a tree written before the field flags records none: the defaults)."""
    return conditions.describe(conditions.conditions({**filt, **flags}))


def code(text: str) -> str:
    """Text a user gave (a path, a URL, a tokenizer's name) as inline code, shown literally whatever
    backticks it holds (shards.conditions.code_span). A text that is not one line (a file's name
    may hold a line break, a carriage return, a direction override) is shown as Python's repr spells
    it, quoted with its escapes visible: no code span or table row holds a line break, and the
    others would show another text than the name."""
    text = str(text)
    return conditions.code_span(text if conditions.one_line(text) else repr(text))


def fenced(language: str, lines: list[str]) -> list[str]:
    """``lines`` as a fenced code block, its fence longer than any run of backticks they hold: a
    path or flag holding three backticks would otherwise end the block and show the rest as markup."""
    runs = [len(run) for line in lines for run in re.findall("`+", line)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [f"{fence}{language}", *lines, fence]


def _cell(text: str) -> str:
    """``text`` in a table's cell: a '|' (a field flag may name a column so) escaped, even inside
    a code span, where GitHub's tables would still split the cell at it."""
    return text.replace("|", "\\|")


def _card(doc: dict, *sections) -> list[str]:
    """A card: its kind's ``sections`` (the top, how it was made, the statistics, then the layout,
    reading it and removing documents), the drops after the statistics, the provenance last."""
    top, making, statistics, *rest = sections
    return [*top(doc), *making(doc), *statistics(doc), *_drops_table(doc),
            *(line for section in rest for line in section(doc)), *_provenance(doc)]


_NO_DOCUMENTS = ["## Reading it", "", "This tree holds no documents.", ""]
_AT_A_GLANCE = ["## At a glance", "", "| | |", "|---|---|"]


def bucketed_card(doc: dict) -> list[str]:
    return _card(doc, _bucketed_top, _bucketed_making, _bucketed_statistics, _bucketed_layout,
                 _bucketed_reading_it, _bucketed_removal)


def _bucketed_reading_it(doc: dict) -> list[str]:
    if not doc["documents"]["kept"]:
        return _NO_DOCUMENTS
    tok = doc["tokenizer"]
    return _bucketed_reading(doc, tok["dtype"], tok["eos_id"], _special_ids(doc))


def _layout_head(width: int, files: list[tuple[str, str]]) -> list[str]:
    """The top of a card's drawn tree: the description files every tree has, then ``files``
    (name, what it is), their names padded to ``width``."""
    rows = [(CARD_NAME, "this card"),
            (layout.STATS_NAME, "the counts and settings; written last, so a tree without it is unfinished"),
            (STATS_JSON_NAME, "the same counts with versions, flags and inputs, as JSON"), *files]
    return ["## Layout", "", "```", ".", *(f"├── {name:<{width}} {what}" for name, what in rows)]


def _special_ids(doc: dict) -> bool:
    """Whether the added tokens' strings were encoded as their ids (``--special-tokens tokenizer``)."""
    return doc["flags"].get("special_tokens") == "tokenizer"


def _bucketed_top(doc: dict) -> list[str]:
    """The front matter, the title and the at-a-glance table of a bucketed tree's card."""
    tok, docs, flags = doc["tokenizer"], doc["documents"], doc["flags"]
    dtype, eos = tok["dtype"], tok["eos_id"]
    itemsize = layout.DTYPES[dtype].itemsize
    kept, tokens = docs["kept"], doc["tokens"]
    lines = _front_matter(doc, "Pre-tokenized, length-bucketed token shards",
                          ["pretokenized", "length-bucketed", "beam-pretokenize"])
    return lines + [
        "# Pre-tokenized, length-bucketed token shards",
        "",
        f"{n(kept)} documents as {n(tokens)} token ids of the {code(tok['spec'])} tokenizer, sorted into "
        f"{len(layout.BUCKET_NAMES)} buckets by length. No text is stored: every shard is a flat array of ids. "
        f"The tree was written by beam-pretokenize {doc['versions']['beam-pretokenize']}; this card, "
        f"`{layout.STATS_NAME}` and `{STATS_JSON_NAME}` describe the same run and are rewritten together "
        "whenever documents are removed.",
        "",
        *_AT_A_GLANCE,
        f"| **Input** | {_cell(_input_line(doc))} |",
        f"| **Kept when** | {_cell(', '.join(_kept_when(flags, doc['filter'])))} |",
        f"| **Tokenizer** | {_cell(code(tok['spec']))}: ids below {n(tok['vocab_size'])}, EOS `{eos}` |",
        f"| **Content** | token ids only, little-endian `{dtype}` ({itemsize} bytes a token); no text |",
        f"| **Documents kept** | **{n(kept)}** of {n(docs['read'])} read ({share(kept, docs['read'])} kept) |",
        f"| **Tokens** | **{n(tokens)}**" + (f", {n(round(tokens / kept))} per document on average" if kept else "")
        + " (EOS included) |",
        f"| **Size of the shards** | {size(tokens * itemsize)} in {n(doc['files'])} files |",
        f"| **Layout** | {len(layout.BUCKET_NAMES)} length buckets × {doc['layout']['partitions']} partitions, a new "
        f"file before {n(int(flags.get('max_shard_bytes', 0)))} bytes |",
        "",
    ]


def _bucketed_making(doc: dict) -> list[str]:
    """How it was made: read, kept, tokenized, bucketed, written."""
    tok, eos = doc["tokenizer"], doc["tokenizer"]["eos_id"]
    kept_when = _kept_when(doc["flags"], doc["filter"])
    lines = [
        "## How it was made",
        "",
        f"1. **Read** {_input_line(doc)} (the list is under [Provenance](#provenance)).",
        f"2. **Kept** a document only when {'; '.join(kept_when)}; every other document was dropped and counted "
        "by reason (below).",
    ]
    if "removal_list" in doc:
        rl = doc["removal_list"]
        lines.append(f"   Documents whose id is on the removal list ({n(rl['ids'])} ids, {n(rl['not_found'])} of them "
                     "not in the input) were left out too.")
    if _special_ids(doc):
        encoding = ("the strings of the tokenizer's added tokens inside a text became their single ids, as "
                    "Hugging Face's AutoTokenizer does by default")
    else:
        encoding = ("special-token strings inside a text (such as `<|endoftext|>`) were encoded as ordinary "
                    "text, never as their special ids")
    return lines + [
        f"3. **Tokenized** with {code(tok['spec'])}: {encoding}; then exactly one EOS (`{eos}`) was appended. "
        "No BOS, no padding.",
        "4. **Bucketed** by the final length n (text tokens + EOS): bucket `N` holds the documents with "
        "previous bound < n ≤ N; `beyond` holds the longer ones.",
        f"5. **Written** into {doc['layout']['partitions']} partitions per bucket, chosen by a hash of the document "
        f"id, in an order shuffled by a hash of the id keyed with seed {doc['layout']['seed']}; a new file starts "
        "before one would pass the size limit, and a document never spans two files.",
        "",
    ]


def _bucketed_statistics(doc: dict) -> list[str]:
    """Documents and tokens per bucket."""
    kept, tokens, read = doc["documents"]["kept"], doc["tokens"], doc["documents"]["read"]
    lines = [
        "## Statistics",
        "",
        f"Kept **{n(kept)}** documents and **{n(tokens)}** tokens of **{n(read)}** documents read.",
        "",
        "| Bucket | Length (tokens, EOS included) | Documents | Tokens | Share of tokens | Files |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for b in doc["buckets"]:
        low, high = b["min_length"], b["max_length"]
        span = f"{n(low)} – {n(high)}" if high is not None else f"> {n(low - 1)}"
        lines.append(f"| `{b['bucket']}` | {span} | {n(b['documents'])} | {n(b['tokens'])} | "
                     f"{share(b['tokens'], tokens)} | {n(b['files'])} |")
    return lines + [
        f"| **Total** | | **{n(kept)}** | **{n(tokens)}** | {share(tokens, tokens)} | **{n(doc['files'])}** |", ""]


def _bucketed_layout(doc: dict) -> list[str]:
    """The tree's files, drawn, and the shards' format."""
    lines = _layout_head(22, [
        (layout.MANIFEST_NAME, "one row per stored document: rel_path | original_id | processed_token_count"),
        (layout.CHECKSUMS_NAME, "sha256 of every shard (sha256sum's format)"),
        (REMOVALS_NAME, "(once documents were removed) one line per removed document"),
    ])
    shown = [b for b in doc["buckets"] if b["files"]]
    for i, b in enumerate(shown):
        branch = "└──" if i == len(shown) - 1 else "├──"
        name = f"{b['bucket']}/"
        lines.append(f"{branch} {name:<22} {n(b['files'])} file{'s' if b['files'] != 1 else ''}")
    width = layout.partition_digits(doc["layout"]["partitions"])
    return lines + [
        "```",
        "",
        f"A shard is `BUCKET/p{'P' * width}_NNNNN{layout.SHARD_SUFFIX}`: its partition, then its index among the "
        "files of that bucket and partition. Empty buckets have no directory.",
        "",
        *_bucketed_file_format(doc),
    ]


def _bucketed_file_format(doc: dict) -> list[str]:
    dtype, eos = doc["tokenizer"]["dtype"], doc["tokenizer"]["eos_id"]
    lines = [
        "### File format",
        "",
        f"- **dtype**: little-endian `{dtype}`, {layout.DTYPES[dtype].itemsize} bytes a token.",
        f"- **structure**: documents back to back, each ending with exactly one EOS (`{eos}`); no BOS, no padding, "
        f"no header. The `{layout.SHARD_SUFFIX}` suffix is only a name: read the files with `np.memmap` or "
        "`np.fromfile`, never `np.load`.",
        f"- **documents**: the rows of `{layout.MANIFEST_NAME}` for a file come in that file's order, so a "
        "document starts at the sum of the token counts before it in its file; the counts include the EOS.",
    ]
    if _special_ids(doc):
        lines.append("- This tree was written with `--special-tokens tokenizer`: an EOS id can occur inside a "
                     "document, so the manifest, not the EOS, says where documents end.")
    return lines + [
        f"- **checks**: `sha256sum -c {layout.CHECKSUMS_NAME}` checks every shard; `pretokenize verify --output .` "
        "checks the format, the manifest and the counts.",
        "",
    ]


def _bucketed_reading(doc: dict, dtype: str, eos: int, special_ids: bool) -> list[str]:
    lines = _bucketed_numpy_snippets(dtype, eos)
    if not special_ids:
        lines += [
            "Or by splitting on EOS, since no document holds an EOS before its end in this tree:",
            "",
            "```python",
            "ends = np.flatnonzero(np.asarray(tokens) == EOS_ID) + 1",
            "by_eos = np.split(np.asarray(tokens), ends[:-1])",
            "assert len(by_eos) == len(documents)",
            "```",
            "",
        ]
    lines += _decode_snippet(doc["tokenizer"]["spec"])
    return lines


def _bucketed_numpy_snippets(dtype: str, eos: int) -> list[str]:
    """One file's tokens, memory-mapped, and its documents by the manifest: NumPy only."""
    np_dtype = layout.DTYPES[dtype].str  # "<u4"
    return [
        "## Reading it",
        "",
        "Run these from this directory; they need only NumPy.",
        "",
        "The tokens of one file, memory-mapped (the manifest's first row names a file):",
        "",
        "```python",
        "import numpy as np",
        "",
        f'DTYPE = np.dtype("{np_dtype}")  # {dtype}, little-endian',
        f"EOS_ID = {eos}",
        "",
        f'with open("{layout.MANIFEST_NAME}", encoding="utf-8") as f:',
        "    next(f)  # the header",
        '    rel_path = next(f).split(" | ")[0]',
        'tokens = np.memmap(rel_path, dtype=DTYPE, mode="r")  # no copy; pages are read on use',
        'print(rel_path, len(tokens), "tokens")',
        "```",
        "",
        "Its documents, by the manifest (right for every tree), each with its original id:",
        "",
        "```python",
        "import itertools",
        "",
        f'with open("{layout.MANIFEST_NAME}", encoding="utf-8") as f:',
        "    next(f)",
        '    rows = (line.rstrip("\\n").split(" | ") for line in f)',
        "    # A file's rows are next to each other, in the file's order.",
        "    rows = list(itertools.takewhile(lambda row: row[0] == rel_path, rows))",
        "ids = [row[1] for row in rows]",
        "ends = np.cumsum([int(row[2]) for row in rows])",
        "documents = np.split(np.asarray(tokens), ends[:-1])  # each ends with its EOS",
        "assert ends[-1] == len(tokens) and all(doc[-1] == EOS_ID for doc in documents)",
        'print(len(documents), "documents; the first is", ids[0])',
        "```",
        "",
    ]


def _decode_snippet(text: str) -> list[str]:
    try:
        spec = parse_spec(text)
    except ValueError:  # not a spec this version knows (a hand-edited dataset_stats.json): named as it is
        spec = None
    kind, arg = (spec.kind, spec.arg) if spec else ("", "")
    if kind == "jet-nemotron" and spec.packaged:
        load = ['from transformers import AutoTokenizer', '',
                'tok = AutoTokenizer.from_pretrained("jet-ai/Jet-Nemotron-2B", trust_remote_code=True)',
                'print(tok.decode(documents[0][:-1].tolist()))']
        who = "the Jet-Nemotron-2B tokenizer (the Qwen2.5 vocabulary) from Hugging Face"
    elif kind == "gpt2" and spec.packaged:
        load = ["import tiktoken", "", 'print(tiktoken.get_encoding("gpt2").decode(documents[0][:-1].tolist()))']
        who = "tiktoken's GPT-2 encoding"
    elif kind == "hf" and arg:
        load = ["from transformers import AutoTokenizer", "", f"tok = AutoTokenizer.from_pretrained({arg!r})",
                "print(tok.decode(documents[0][:-1].tolist()))"]
        who = f"{code(arg)}'s tokenizer"
    else:
        return [f"Decode the ids with the tokenizer {code(text)} names; its files' sha256 are under "
                "[Provenance](#provenance).", ""]
    return [f"Back to text, with {who} (it needs that library, and may download the tokenizer):", "",
            *fenced("python", load), ""]


def _bucketed_removal(doc: dict) -> list[str]:
    removed = doc["drops"].get("removed", 0)
    return [
        "## Removing documents",
        "",
        f"`{layout.MANIFEST_NAME}` keeps the original id of every stored document, so a request to take one out "
        "(personal data, a copyright claim, a site owner's opt-out) can be carried out on this tree itself:",
        "",
        "```bash",
        "pretokenize remove --output . --removal-list ids.txt   # ids one per line",
        "```",
        "",
        "Only the files that hold a listed id are rewritten; every other file keeps its bytes. Each removed "
        f"document gets a line in `{REMOVALS_NAME}`, and `{layout.STATS_NAME}`, `{STATS_JSON_NAME}`, "
        f"`{layout.CHECKSUMS_NAME}` and this card are rewritten. A later run of the job into this directory "
        f"keeps every id `{REMOVALS_NAME}` lists out; a whole re-run with `--removal-list ids.txt` does the same "
        "from the start.",
        "",
        f"Documents left out by id so far: **{n(removed)}**." if removed else "No document has been left out by id.",
        "",
        "Whoever copies this tree or builds on it should pass removal requests on, and act on those the "
        "source dataset receives.",
        "",
    ]


# --- the scaffold (llm.c) layout -------------------------------------------------------------------


def scaffold_card(doc: dict) -> list[str]:
    return _card(doc, _scaffold_top, _scaffold_making, _scaffold_statistics, _scaffold_layout,
                 _scaffold_reading_it, _scaffold_removal)


def _scaffold_reading_it(doc: dict) -> list[str]:
    first_split = next((s for s in doc["splits"] if s["files"]), None)
    if first_split is None:
        return _NO_DOCUMENTS
    tok = doc["tokenizer"]
    return _scaffold_reading(first_split["split"], tok["eot_id"], tok["ff_base"], tok["max_token_id"], doc["layout"])


def _scaffold_removal(doc: dict) -> list[str]:
    return [
        "## Removing documents",
        "",
        "This tree has no per-document manifest, and documents may run across shard boundaries, so a "
        "document cannot be cut out of it in place (`pretokenize remove` works on bucketed trees only). To "
        "honour a removal request, take the document out of the input and run the job again with the same "
        "flags: every other document keeps its split, and the shards are written anew.",
        "",
        "Whoever copies this tree or builds on it should pass removal requests on, and act on those the "
        "source receives.",
        "",
    ]


def _scaffold_top(doc: dict) -> list[str]:
    """The front matter, the title and the at-a-glance table of a scaffold tree's card."""
    tok, docs, lay = doc["tokenizer"], doc["documents"], doc["layout"]
    kept, tokens = docs["kept"], doc["tokens"]
    splits = {s["split"]: s for s in doc["splits"]}
    eot, ff, top = tok["eot_id"], tok["ff_base"], tok["max_token_id"]
    lines = _front_matter(doc, "Countdown-token (scaffold) shards in llm.c's format",
                          ["pretokenized", "scaffold-tokens", "countdown-tokens", "llm.c", "gpt2", "beam-pretokenize"])
    return lines + [
        "# Countdown-token (scaffold) shards in llm.c's format",
        "",
        f"{n(kept)} documents as {n(tokens)} token ids: GPT-2 BPE, with a countdown token `<ff_N>` before every "
        "word that says how many words of the document follow it. The shards are llm.c data files, so "
        f"llm.c-style loaders read them as they are. The tree was written by beam-pretokenize "
        f"{doc['versions']['beam-pretokenize']}; this card, `{layout.STATS_NAME}` and `{STATS_JSON_NAME}` "
        "describe the same run.",
        "",
        *_AT_A_GLANCE,
        f"| **Input** | {_cell(_input_line(doc))} |",
        f"| **Tokenizer** | {_cell(code(tok['spec']))} (GPT-2 BPE, ids 0 – {eot - 1}), EOT `{eot}`, "
        f"`<ff_N>` = {ff} + N for "
        f"N = 0 – {top - ff} |",
        f"| **Content** | token ids only, little-endian `uint16`, behind a {lay['header_bytes']}-byte header; "
        "no text |",
        f"| **Documents kept** | **{n(kept)}** of {n(docs['read'])} read ({share(kept, docs['read'])} kept) |",
        f"| **Tokens** | **{n(tokens)}** (train {n(splits['train']['tokens'])}, val {n(splits['val']['tokens'])}) |",
        f"| **Splits** | `val` holds a stable {100 * lay['val_fraction']:g}% of the ids "
        "(a hash of the id), `train` the rest |",
        f"| **Shards** | {n(doc['files'])} files of {n(lay['shard_tokens'])} tokens each, the last of a split "
        "holding the rest |",
        "",
    ]


def _scaffold_making(doc: dict) -> list[str]:
    """How it was made: read, words, encoded, split."""
    lay, enc, eot = doc["layout"], doc["encoding"], doc["tokenizer"]["eot_id"]
    lines = [
        "## How it was made",
        "",
        f"1. **Read** {_input_line(doc)} (the list is under [Provenance](#provenance)).",
    ]
    if enc["annotate"]:
        lines.append("2. **Split into words** here: each text's words, with punctuation split off, each given "
                     "its countdown.")
    else:
        lines.append("2. **Took the words** of each annotated text (`<ff_N> word ...`) and recomputed the "
                     f"countdown from them (documents whose given countdown differed: "
                     f"{n(enc['countdown_mismatch_documents'])}).")
    long_docs = ("dropped and counted" if enc["long_docs"] == "skip"
                 else f"cut into pieces of {n(enc['max_words'])} words, each its own document")
    return lines + [
        f"3. **Encoded** every word with GPT-2 BPE on its own, after its `<ff_N>`, and ended each document with "
        f"EOT `{eot}`. A document of more than {n(enc['max_words'])} words was {long_docs}"
        + (f"; one with a word over {n(enc['max_word_chars'])} characters was dropped and counted."
           if enc["max_word_chars"] else "."),
        f"4. **Split** by a hash of the id into `val` ({lay['val_fraction']}) and `train`, ordered by a hash "
        f"of the id keyed with seed {lay['seed']}, and cut into shards of exactly {n(lay['shard_tokens'])} "
        "tokens: a document may continue in the next shard, as in llm.c's own data files.",
        "",
    ]


def _scaffold_statistics(doc: dict) -> list[str]:
    """Documents, sequences, words and tokens per split."""
    docs = doc["documents"]
    lines = [
        "## Statistics",
        "",
        f"Kept **{n(docs['kept'])}** documents and **{n(doc['tokens'])}** tokens of **{n(docs['read'])}** "
        "documents read.",
        "",
        "| Split | Documents | Sequences | Words | Tokens | Files |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in doc["splits"]:
        lines.append(f"| `{s['split']}` | {n(s['documents'])} | {n(s['sequences'])} | {n(s['words'])} | "
                     f"{n(s['tokens'])} | {n(s['files'])} |")
    total = {k: sum(s[k] for s in doc["splits"]) for k in ("documents", "sequences", "words", "tokens", "files")}
    return lines + [
        f"| **Total** | **{n(total['documents'])}** | **{n(total['sequences'])}** | **{n(total['words'])}** | "
        f"**{n(total['tokens'])}** | **{n(total['files'])}** |", "",
        "A sequence is what the shards hold as one document (more than the documents only when long ones "
        "were cut into pieces).", ""]


def _scaffold_layout(doc: dict) -> list[str]:
    """The tree's files, drawn, and the shards' format."""
    lines = _layout_head(20, [(layout.CHECKSUMS_NAME, "sha256 of every shard (sha256sum's format)")])
    shown = [s for s in doc["splits"] if s["files"]]
    for i, s in enumerate(shown):
        branch, inner = ("└──", "    ") if i == len(shown) - 1 else ("├──", "│   ")
        width = llmc.shard_digits(s["files"])
        first = llmc.shard_rel_path(s["split"], 0, width).split("/")[1]
        lines.append(f"{branch} {s['split']}/")
        if s["files"] > 1:
            last = llmc.shard_rel_path(s["split"], s["files"] - 1, width).split("/")[1]
            lines.append(f"{inner}└── {first} … {last}")
        else:
            lines.append(f"{inner}└── {first}")
    lay, tok = doc["layout"], doc["tokenizer"]
    eot, ff, top = tok["eot_id"], tok["ff_base"], tok["max_token_id"]
    return lines + [
        "```",
        "",
        "### Shard format",
        "",
        f"- **header**: {lay['header_bytes'] // 4} little-endian int32: `[0]` = {lay['magic']} (magic), "
        f"`[1]` = {lay['version']} (version), `[2]` = the number of tokens.",
        "- **body**: that many little-endian `uint16` token ids.",
        f"- **ids**: 0 – {eot - 1} GPT-2 BPE, {eot} EOT (ends every document), {ff} – {top} `<ff_0>` – "
        f"`<ff_{top - ff}>`. A document reads `<ff_N> word-tokens … <ff_0> word-tokens EOT`.",
        f"- **checks**: `sha256sum -c {layout.CHECKSUMS_NAME}` checks every shard; `pretokenize verify --output .` "
        "checks headers, ids and countdowns.",
        "",
    ]


def _scaffold_reading(split: str, eot: int, ff: int, top: int, lay: dict) -> list[str]:
    """One shard, its header checked, and the documents of ``split``: NumPy only; then back to text."""
    return [
        "## Reading it",
        "",
        "Run these from this directory; they need only NumPy.",
        "",
        "One shard, its header checked:",
        "",
        "```python",
        "import glob",
        "",
        "import numpy as np",
        "",
        f"EOT, FF_BASE, FF_LAST = {eot}, {ff}, {top}",
        "",
        "def load_shard(path):",
        f'    header = np.fromfile(path, dtype="<i4", count={lay["header_bytes"] // 4})',
        f"    assert header[0] == {lay['magic']} and header[1] == {lay['version']}, path",
        f'    tokens = np.fromfile(path, dtype="<u2", offset={lay["header_bytes"]})',
        "    assert len(tokens) == header[2], path",
        "    return tokens",
        "",
        f'paths = sorted(glob.glob("{split}/shard_*.bin"))  # names sort in stream order',
        "tokens = load_shard(paths[0])",
        'print(paths[0], len(tokens), "tokens")',
        "```",
        "",
        f"The documents of the `{split}` split: its shards in order are one stream, split after each EOT:",
        "",
        "```python",
        "stream = np.concatenate([load_shard(p) for p in paths])",
        "ends = np.flatnonzero(stream == EOT) + 1",
        "documents = np.split(stream, ends[:-1])  # each ends with its EOT",
        "assert ends[-1] == len(stream)",
        "words = [int(((d >= FF_BASE) & (d <= FF_LAST)).sum()) for d in documents]",
        "assert all(d[0] - FF_BASE == w - 1 for d, w in zip(documents, words))  # the countdown starts at words - 1",
        'print(len(documents), "documents;", sum(words), "words")',
        "```",
        "",
        *_scaffold_decode_snippet(split),
    ]


def _scaffold_decode_snippet(split: str) -> list[str]:
    return [
        "Back to text, a word at a time (it needs tiktoken, which may download GPT-2's ranks); "
        f"`pretokenize decode {split}` prints the same:",
        "",
        "```python",
        "import tiktoken",
        "",
        'gpt2 = tiktoken.get_encoding("gpt2")',
        "words, word = [], []",
        "for t in documents[0].tolist():",
        "    if t >= FF_BASE or t == EOT:",
        "        if word:",
        "            words.append(gpt2.decode(word))",
        "        word = []",
        "    else:",
        "        word.append(t)",
        'print(" ".join(words))',
        "```",
        "",
    ]


def write_description(output: str, kind: str, files: dict[str, bytes]) -> None:
    """Write the files that describe a tree (dataset_stats.json, README.md), each listed in the
    ownership record as derived before it is written: a later publish deletes them with the other
    files derived from the old shards, and writes its own. A file of that name the record does not
    list (a user's README.md in a tree an older version wrote) is left as it is, and not written."""
    if not files:
        return
    out = tree.Tree(output)
    record = tree.owned(output, kind)
    theirs = {rel for rel in files if rel not in record.derived and out.lexists(rel)}
    for rel in sorted(theirs):
        log.warning("%s is not the tool's (its record does not list it): left as it is, not rewritten",
                    storage.join(output, rel))
    ours = {rel: data for rel, data in files.items() if rel not in theirs}
    tree.record_files(output, record, add_derived=sorted(ours))
    for rel, data in sorted(ours.items()):
        tree.write_file(output, rel, data)


# The description files every publish writes anew (write_description): a re-run rewrites them.
DESCRIPTION_NAMES = frozenset({STATS_JSON_NAME, CARD_NAME})
