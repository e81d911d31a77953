"""The dataset card shows what a user gave (an input path, a tokenizer's name) literally: a path with
backticks or a '|' neither ends its code span or the command's block nor cuts a table's row."""

from __future__ import annotations

import os
import shutil
from html.parser import HTMLParser

import pytest
from conftest import SAMPLE_PARQUET

from pipelines import cli
from shards.card import CARD_NAME

ODD = "in ``` x | `y` ``.parquet"  # a file's name: three backticks, a bar, a code span of its own


class _Code(HTMLParser):
    """The text of each <code> element, and each <pre> block's, of rendered HTML."""

    def __init__(self):
        super().__init__()
        self.code, self.blocks, self._open = [], [], []

    def handle_starttag(self, tag, attrs):
        self._open.append(tag)
        if tag == "code":
            (self.blocks if "pre" in self._open[:-1] else self.code).append("")

    def handle_endtag(self, tag):
        self._open.pop()

    def handle_data(self, data):
        if self._open and self._open[-1] == "code":
            (self.blocks if "pre" in self._open[:-1] else self.code)[-1] += data


def _card_of_input(tmp_path, name: str) -> tuple[str, _Code]:
    """The card of a run on the sample copied to an input file called ``name``, rendered as a Hub
    page renders it (CommonMark with tables), and its code."""
    from markdown_it import MarkdownIt

    src = tmp_path / name
    shutil.copy(SAMPLE_PARQUET, src)
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(src), "--output", str(out), "--tokenizer", "gpt2",
                     "--runner=FnApiRunner"]) == 0
    html = MarkdownIt("commonmark").enable("table").render((out / CARD_NAME).read_text())
    found = _Code()
    found.feed(html)
    return html, found


def test_an_odd_input_path_is_shown_whole_in_the_card(tmp_path):
    html, found = _card_of_input(tmp_path, ODD)
    assert found.code.count(ODD) >= 3, found.code  # the Input row, the Read step and the list of inputs
    [command] = [b for b in found.blocks if "pretokenize bucketed" in b]  # one block, whole
    assert ODD in command and command.rstrip().endswith("--output DIR"), command
    [row] = [line for line in html.split("<tr>") if "<strong>Input</strong>" in line]
    assert row.count("<td>") == 2 and f"<code>{_escaped(ODD)}</code>" in row, row


def _escaped(text: str) -> str:
    import html

    return html.escape(text, quote=False)


BROKEN = "in\r\nx `y` | z.parquet"  # a file's name with a carriage return and a line feed


def test_an_input_name_with_a_line_break_is_shown_escaped_on_one_line(tmp_path):
    """A code span cannot hold a line break, nor a table's row: the name cut the Input row in two
    and the command's word over two lines. It is shown as repr spells it, the command's word in
    bash's $'...', which reads back as the name."""
    import subprocess

    html, found = _card_of_input(tmp_path, BROKEN)
    shown = repr(BROKEN)  # the input as recorded: its name under its root
    assert found.code.count(shown) >= 3, found.code  # the Input row, the Read step and the list of inputs
    [row] = [line for line in html.split("<tr>") if "<strong>Input</strong>" in line]
    assert row.count("<td>") == 2 and f"<code>{_escaped(shown)}</code>" in row, row
    assert "<strong>Kept when</strong>" in html.split("<tr>")[html.split("<tr>").index(row) + 1]  # the next row
    [command] = [b for b in found.blocks if "pretokenize bucketed" in b]
    assert command.count("\n") == 1 and command.rstrip().endswith("--output DIR"), command  # one line
    word = command.split(" --input ")[1].split(" --")[0]
    said = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True).stdout
    assert said == BROKEN.encode(), said


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_the_commands_word_reads_back_as_the_name_in_any_locale(locale):
    """bash's \\uHHHH gives the character only in a locale that has it: under LC_ALL=C (a container,
    cron) it stays the six characters. A byte escape (\\xHH) is the same bytes in any locale."""
    import subprocess

    from shards import card

    name = "in\n\u202e\u2028\x85\u00e9 \udcff.parquet"  # a line break, a direction override, a C1 control, a bad byte
    line = card.command({"job": "bucketed", "flags": {"input": name}})
    word = line.split(" --input ")[1].split(" --output ")[0]
    said = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True,
                          env={**os.environ, "LC_ALL": locale}).stdout
    assert said == name.encode("utf-8", "surrogateescape"), said
