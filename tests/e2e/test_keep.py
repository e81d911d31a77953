"""--keep through the CLI: conditions on the bundled sample's own columns are applied, counted under
their own names in the stats, the card and dataset_stats.json, re-run by verify, and refused at
launch in one line when they cannot work."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE_PARQUET, finepdfs_row, stored_ids, write_jsonl

from pipelines import cli
from shards import layout, manifest
from shards.card import CARD_NAME
from shards.provenance import STATS_JSON_NAME

RUNNER = ["--runner=FnApiRunner"]
TOKENIZER = ["--tokenizer", "gpt2"]
TRUNCATED = "is_truncated == false"
SCORE = "full_doc_lid_score >= 0.95"
KEEP = ["--keep", TRUNCATED, "--keep", SCORE]


def bucketed(src, out, *flags) -> int:
    return cli.main(["bucketed", "--input", str(src), "--output", str(out), *TOKENIZER, *RUNNER, *flags])


@pytest.fixture(scope="module")
def kept_tree(tmp_path_factory):
    out = tmp_path_factory.mktemp("keep") / "out"
    assert bucketed(SAMPLE_PARQUET, out, *KEEP) == 0
    return out


def test_the_sample_has_the_columns_and_the_conditions_drop_some_not_all():
    table = pq.read_table(SAMPLE_PARQUET, columns=["is_truncated", "full_doc_lid_score"])
    truncated = table.column("is_truncated").to_pylist()
    scores = table.column("full_doc_lid_score").to_pylist()
    assert 0 < sum(truncated) < len(truncated)
    assert 0 < sum(s < 0.95 for s in scores) < len(scores)


def test_each_keep_is_applied_and_counted_under_its_own_name(kept_tree, tmp_path):
    rows = pq.read_table(SAMPLE_PARQUET, columns=["id", "is_truncated", "full_doc_lid_score"]).to_pylist()
    assert bucketed(SAMPLE_PARQUET, tmp_path / "plain") == 0
    plain = set(stored_ids(tmp_path / "plain"))
    expected = {r["id"] for r in rows if r["id"] in plain and not r["is_truncated"] and r["full_doc_lid_score"] >= 0.95}
    assert set(stored_ids(kept_tree)) == expected and 0 < len(expected) < len(plain)

    stats = manifest.DatasetStats.from_text((kept_tree / layout.STATS_NAME).read_text())  # as `stats` reads it
    assert stats.drops[TRUNCATED] > 0 and stats.drops[SCORE] > 0
    assert stats.filter["keep"] == (TRUNCATED, SCORE)
    text = (kept_tree / layout.STATS_NAME).read_text()
    assert f"\n{TRUNCATED} | {stats.drops[TRUNCATED]}\n" in text and f'keep: ["{TRUNCATED}", "{SCORE}"]\n' in text

    doc = json.loads((kept_tree / STATS_JSON_NAME).read_text())
    assert doc["drops"][TRUNCATED] == stats.drops[TRUNCATED] and doc["drops"][SCORE] == stats.drops[SCORE]
    assert doc["filter"]["keep"] == [TRUNCATED, SCORE] and doc["flags"]["keep"] == [TRUNCATED, SCORE]

    card = (kept_tree / CARD_NAME).read_text()
    assert "`is_truncated` is `false`; `full_doc_lid_score` ≥ 0.95; every other document was dropped" in card
    assert f"| `{TRUNCATED}` | {stats.drops[TRUNCATED]} |" in card
    assert f"--keep '{TRUNCATED}' --keep '{SCORE}'" in card


def test_the_stats_command_reads_the_counts_back(kept_tree, capsys):
    assert cli.main(["stats", "--output", str(kept_tree), "--json", "--png", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["buckets"]


def test_verify_re_runs_the_conditions(kept_tree, capsys):
    assert cli.main(["verify", "--output", str(kept_tree), "--input", str(SAMPLE_PARQUET), *RUNNER]) == 0
    assert "source compared on all ids" in capsys.readouterr().out


def test_verify_fails_a_tree_that_holds_a_document_a_condition_rejects(tmp_path, capsys):
    """A tree written without the condition, whose stats claim it: the truncated documents it holds
    are found when verify re-reads the source with the conditions the stats record."""
    out = tmp_path / "out"
    assert bucketed(SAMPLE_PARQUET, out) == 0
    stats = out / layout.STATS_NAME
    stats.write_text(stats.read_text().replace("\n\nbucket |", f'\nkeep: ["{TRUNCATED}"]\n\nbucket |'))
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), "--input", str(SAMPLE_PARQUET), *RUNNER]) == 1
    assert "stored, but the input has no such document kept by the filter" in capsys.readouterr().out


def test_a_condition_on_the_length_in_tokens_is_checked_once_tokenized(tmp_path):
    assert bucketed(SAMPLE_PARQUET, tmp_path / "out", "--keep", "@tokens <= 1024") == 0
    with open(tmp_path / "out" / layout.MANIFEST_NAME, encoding="utf-8") as f:
        rows = list(manifest.read_rows(f))
    assert rows and all(n <= 1024 and path.startswith("1024/") for path, _, n in rows)
    stats = manifest.DatasetStats.from_text((tmp_path / "out" / layout.STATS_NAME).read_text())
    assert stats.drops["@tokens <= 1024"] > 0


@pytest.mark.parametrize(
    "condition, problem",
    [
        ("is_truncated = false", "--keep 'is_truncated = false': cannot read"),
        ("no_such_column == 1", "missing column 'no_such_column'"),
        ("is_truncated >= 0.5", "column 'is_truncated' has type bool, expected number (read for --keep "
                                "'is_truncated >= 0.5')"),
    ],
    ids=["malformed", "unknown-column", "type-mismatch"],
)
def test_a_condition_that_cannot_work_is_one_line_at_launch(tmp_path, capsys, condition, problem):
    assert bucketed(SAMPLE_PARQUET, tmp_path / "out", "--keep", condition) == 2
    err = capsys.readouterr().err
    assert problem in err and repr(condition) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_train_bpe_filters_documents_by_the_same_list(tmp_path, capsys):
    out = tmp_path / "tok"
    assert cli.main(["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--merges", "5",
                     "--keep", TRUNCATED, *RUNNER]) == 0
    text = (out / "training_stats.txt").read_text()
    assert f"documents dropped ({TRUNCATED}): " in text and f"--keep '{TRUNCATED}'" in text
    capsys.readouterr()
    assert cli.main(["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "t2"), "--merges", "5",
                     "--keep", "@tokens > 3", *RUNNER]) == 2
    err = capsys.readouterr().err
    assert "--keep '@tokens > 3': train-bpe counts words" in err and len(err.strip().splitlines()) == 1


def test_verify_without_the_source_judges_the_length_in_tokens_by_the_manifest(tmp_path, capsys):
    out = tmp_path / "out"
    assert bucketed(SAMPLE_PARQUET, out, "--keep", "@tokens <= 4096") == 0
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0
    stats = out / layout.STATS_NAME
    stats.write_text(stats.read_text().replace('keep: ["@tokens <= 4096"]', 'keep: ["@tokens <= 1024"]'))
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 1
    assert "tokens, but the tree keeps only @tokens <= 1024" in capsys.readouterr().out


# Conditions whose values hold what Markdown or HTML would act on: backticks, tags, emphasis, a link.
HOSTILE = ["extractor in ['docling', '`</td><script>alert(1)</script>']",
           'url != "x`` <img src=x onerror=alert(1)> *y* [z](http://e.invalid)"',
           "dump >= '<b>CC</b>'"]


def test_a_condition_is_shown_literally_in_the_card(tmp_path):
    """The card, rendered as CommonMark with tables: every value is text inside a code element (no
    tag of its own, no emphasis), and the row that lists the conditions holds them all."""
    from html.parser import HTMLParser

    from markdown_it import MarkdownIt

    out = tmp_path / "out"
    assert bucketed(SAMPLE_PARQUET, out, *(f for c in HOSTILE for f in ("--keep", c))) == 0
    card = (out / CARD_NAME).read_text()
    tags, code, inside = [], [], []

    class Elements(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append((tag, *(value for _, value in attrs)))
            inside.append(tag == "code")

        def handle_endtag(self, tag):
            inside[-1:] = []

        def handle_data(self, data):
            if inside and inside[-1]:
                code.append(data)

    Elements().feed(MarkdownIt("commonmark").enable("table").render(card))
    assert not {"script", "img", "b", "em"} & {t[0] for t in tags}
    assert not [t for t in tags if "http://e.invalid" in t]
    assert "`</td><script>alert(1)</script>" in code and "<b>CC</b>" in code
    assert "x`` <img src=x onerror=alert(1)> *y* [z](http://e.invalid)" in code
    assert HOSTILE[0].replace("'", '"').replace('", "', '", "') in code  # the drops table's reason, its name
    assert kept_when(card).endswith("<code>&lt;b&gt;CC&lt;/b&gt;</code></td>")  # the last condition's end


def kept_when(card: str) -> str:
    """The second cell of the card's "Kept when" row as it renders (a table drops the cells a stray
    '|' would add beyond its columns)."""
    from markdown_it import MarkdownIt

    [row] = [line for line in card.splitlines() if line.startswith("| **Kept when** |")]
    html = MarkdownIt("commonmark").enable("table").render(f"| a | b |\n|---|---|\n{row}\n")
    return html.split("<td>")[2].split("</tr>")[0].strip()


def test_a_field_flag_naming_a_column_with_a_bar_keeps_the_cards_table_whole(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", [finepdfs_row(f"d{i}", "some text", **{"s|b": 0.97}) for i in range(3)])
    assert bucketed(src, tmp_path / "out", "--lid-score-field", "s|b") == 0
    assert "<code>s|b</code> ≥ 0.9" in kept_when((tmp_path / "out" / CARD_NAME).read_text())
