"""Every writing and reading command over trees salted with traps (issue 22): after each, every file
outside the tree exists and is byte-identical, a user's file inside is as it was, and the command
either did its work or refused in one line (exit 2, no traceback).

The traps: a symbolic link to an outside directory wherever a name can be (a bucket or split
directory, ``.pretokenize-tmp``, ``megatron/``, a record entry, a file of the tokenizer directory),
names that climb out (a record entry, a manifest row), and a user's file at every name a tool
writes that is not the tool's. The commands: bucketed, scaffold, remove, verify, export megatron,
stats, train-bpe, decode and the reader (shards.reader.open_tree).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import GPT2_RANKS, REPO, SAMPLE_PARQUET, finepdfs_row, run_cli
from tree_traps import snapshot

from shards import layout, manifest, tree
from shards.reader import open_tree

RUNNER = "--runner=FnApiRunner"
GPT2 = f"tiktoken:{GPT2_RANKS}"
SCAFFOLD_INPUT = REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(30)]
USER_BYTES = b"the user's own file, which no tool may overwrite\n"


@pytest.fixture(scope="module")
def bases(source, tmp_path_factory):
    """A finished tree of each kind, built once: bucketed, scaffold, and a trained tokenizer."""
    from pipelines import cli

    root = tmp_path_factory.mktemp("bases")
    built = {"bucketed": root / "bucketed", "scaffold": root / "scaffold", "tokenizer": root / "tok"}
    assert cli.main(["bucketed", "--input", str(source), "--output", str(built["bucketed"]), "--partitions", "2",
                     "--tokenizer", GPT2, RUNNER]) == 0
    assert cli.main(["scaffold", "--input", str(SCAFFOLD_INPUT), "--output", str(built["scaffold"]),
                     "--tokenizer", GPT2, "--shard-tokens", "400", RUNNER]) == 0
    assert cli.main(["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(built["tokenizer"]),
                     "--language", "none", "--token-count-field", "none", "--vocab-size", "300", RUNNER]) == 0
    return built


# -- traps: each plants one in the tree ``out``, with ``outside`` a directory beside it ---------------

def _link_dir_out(out, outside, name):
    """Move the tree's directory ``name`` outside and leave a link to it in its place."""
    shutil.move(str(out / name), str(outside / name))
    os.symlink(outside / name, out / name)


def _first_dir(out, among):
    return next(name for name in among if (out / name).is_dir())


def trap_data_dir_link(out, outside, kind):
    _link_dir_out(out, outside, _first_dir(out, layout.BUCKET_NAMES if kind == "bucketed" else ("train", "val")))


def trap_new_data_dir_link(out, outside, kind):
    """A link where the job has written nothing yet, but may: the last bucket, or the val split."""
    name = "beyond" if kind == "bucketed" else "val"
    if (out / name).exists():
        shutil.rmtree(out / name)
    (outside / name).mkdir()
    (outside / name / "mine.bin").write_bytes(b"\0" * 64)
    os.symlink(outside / name, out / name)


def trap_temp_dir_link(out, outside, kind):
    scratch = outside / "scratch"
    (scratch / "project").mkdir(parents=True)
    (scratch / "project" / "results.csv").write_text("a,b\n1,2\n")
    (scratch / "work-0123456789abcdef0123").mkdir()
    (scratch / "work-0123456789abcdef0123" / "keep.txt").write_text("another tool's work\n")
    os.symlink(scratch, out / layout.TEMP_DIR_NAME)


def trap_megatron_link(out, outside, kind):
    (outside / "megatron").mkdir()
    (outside / "megatron" / "data_args.txt").write_text("someone else's blend\n")
    os.symlink(outside / "megatron", out / "megatron")


def _edit_record(out, **add):
    path = out / tree.RECORD_NAME
    record = json.loads(path.read_text())
    for key, names in add.items():
        record[key] = sorted(set(record[key]) | set(names))
    path.write_text(json.dumps(record))


def trap_record_entry_link(out, outside, kind):
    """The record lists a derived file that is a link to an outside file: deleting it may remove the
    link, never the file."""
    (outside / "notes.txt").write_text("the user's notes\n")
    os.symlink(outside / "notes.txt", out / "notes.txt")
    _edit_record(out, derived=["notes.txt"])


def trap_record_entry_climbs(out, outside, kind):
    (outside / "notes.txt").write_text("the user's notes\n")
    _edit_record(out, files=[f"../{outside.name}/notes.txt"])


def trap_manifest_row_climbs(out, outside, kind):
    (outside / "v.bin").write_bytes(np.arange(50, dtype="<u4").tobytes())
    with open(out / layout.MANIFEST_NAME, "a", encoding="utf-8") as f:
        f.write(manifest.format_row(f"../{outside.name}/v.bin", "doc-00", 50))


# The names export and stats write in a bucketed tree; a user's file at each, the record not listing it.
USER_FILES = ("length_stats.txt", "length_histogram.png", "megatron/data_args.txt", "megatron/1024/p00_00000.idx")


def trap_user_files(out, outside, kind):
    for name in USER_FILES:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(USER_BYTES)


def trap_tokenizer_file_link(out, outside, kind):
    """A file of the tokenizer directory is a link to an outside file (of the same bytes)."""
    name = "tokenizer.json"
    shutil.move(str(out / name), str(outside / name))
    os.symlink(outside / name, out / name)


TRAPS = {
    "bucketed": [trap_data_dir_link, trap_new_data_dir_link, trap_temp_dir_link, trap_megatron_link,
                 trap_record_entry_link, trap_record_entry_climbs, trap_manifest_row_climbs, trap_user_files],
    "scaffold": [trap_data_dir_link, trap_new_data_dir_link, trap_temp_dir_link, trap_record_entry_link,
                 trap_record_entry_climbs],
    "tokenizer": [trap_temp_dir_link, trap_tokenizer_file_link, trap_record_entry_link, trap_record_entry_climbs],
}


# -- commands: each returns argv for the CLI, or a callable for the reader -----------------------------

def read_everything(out):
    """The reader as a training job uses it: open the tree, read every document."""
    shards = open_tree(str(out))
    return sum(len(shards.document(i)) for i in range(len(shards.documents)))


COMMANDS = {
    "bucketed": {
        "bucketed": lambda out, src, tmp: ["bucketed", "--input", str(src), "--output", str(out), "--partitions", "3",
                                           "--tokenizer", GPT2, RUNNER],
        "remove": lambda out, src, tmp: ["remove", "--output", str(out), "--removal-list",
                                         str(_ids(tmp, ["doc-00", "doc-03"])), RUNNER],
        "verify": lambda out, src, tmp: ["verify", "--output", str(out), RUNNER],
        "export": lambda out, src, tmp: ["export", "megatron", "--output", str(out)],
        "stats": lambda out, src, tmp: ["stats", "--output", str(out)],
        "reader": lambda out, src, tmp: read_everything,
    },
    "scaffold": {
        "scaffold": lambda out, src, tmp: ["scaffold", "--input", str(SCAFFOLD_INPUT), "--output", str(out),
                                           "--tokenizer", GPT2, "--shard-tokens", "500", RUNNER],
        "verify": lambda out, src, tmp: ["verify", "--output", str(out), RUNNER],
        "decode": lambda out, src, tmp: ["decode", str(out / "train"), "--docs", "3", "--tokenizer", GPT2],
        "reader": lambda out, src, tmp: read_everything,
    },
    "tokenizer": {
        "train-bpe": lambda out, src, tmp: ["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(out),
                                            "--language", "none", "--token-count-field", "none",
                                            "--vocab-size", "280", RUNNER],
        # The tokenizer directory read by a job (its output elsewhere, in the test's directory).
        "bucketed-trained": lambda out, src, tmp: ["bucketed", "--input", str(src), "--output", str(tmp / "with-tok"),
                                                   "--tokenizer", f"trained:{out}", RUNNER],
    },
}


def _ids(tmp, ids):
    path = tmp / "flagged.txt"
    path.write_text("".join(f"{i}\n" for i in ids))
    return path


CASES = [(kind, trap, command) for kind, traps in TRAPS.items() for trap in traps for command in COMMANDS[kind]]


@pytest.mark.parametrize(("kind", "trap", "command"), CASES,
                         ids=[f"{kind}-{trap.__name__[5:]}-{command}" for kind, trap, command in CASES])
def test_no_command_touches_anything_outside_its_tree(kind, trap, command, bases, source, tmp_path, capsys):
    out, outside = tmp_path / "tree", tmp_path / "outside"
    shutil.copytree(bases[kind], out, symlinks=True)
    outside.mkdir()
    (outside / "precious.txt").write_text("a file of the user's, beside the tree\n")
    trap(out, outside, kind)
    before = snapshot(outside)
    users = {name: (out / name).read_bytes() for name in USER_FILES if (out / name).is_file()}

    what = COMMANDS[kind][command](out, source, tmp_path)
    if callable(what):
        try:
            what(out)
        except (ValueError, OSError) as e:  # a refusal: one line naming the problem
            assert "\n" not in str(e) and str(e), repr(e)
    else:
        result = run_cli(capsys, what)
        # verify's 1 is its work done: it found problems and said so.
        if result.code not in ((0, 1) if command == "verify" else (0,)):
            result.refusal  # noqa: B018 - asserts exit 2, one line, no traceback
        assert "Traceback" not in result.err, result.err

    assert snapshot(outside) == before, "a file outside the tree was changed, added or deleted"
    for name, data in users.items():
        assert (out / name).read_bytes() == data, f"the user's {name} was overwritten"
