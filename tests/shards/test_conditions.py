"""Conditions as data: how one is read, named and said, and the default list its shorthands edit."""

from __future__ import annotations

import pytest

from shards import conditions
from shards.conditions import TOKENS, Condition, ConditionError, parse


@pytest.mark.parametrize(
    "text, column, op, value, kind",
    [
        ("is_truncated == false", "is_truncated", "==", False, "boolean"),
        ("is_truncated != true", "is_truncated", "!=", True, "boolean"),
        ("full_doc_lid_score >= 0.8", "full_doc_lid_score", ">=", 0.8, "number"),
        ("score > -3", "score", ">", -3, "number"),
        ("score <= 1e-3", "score", "<=", 0.001, "number"),
        ("count < 10", "count", "<", 10, "number"),
        ("dump in ['CC-2024', \"CC-2025\"]", "dump", "in", ("CC-2024", "CC-2025"), "string"),
        ("n in [1, 2.5, null]", "n", "in", (1, 2.5, None), "number"),
        ("url == null", "url", "==", None, "any"),
        ("url != null", "url", "!=", None, "any"),
        ('title == "a \\"quoted\\" word"', "title", "==", 'a "quoted" word', "string"),
        (f"{TOKENS} <= 4096", TOKENS, "<=", 4096, "number"),
        ("meta.lang_v2==  'en'", "meta.lang_v2", "==", "en", "string"),
        ("count\t<\t10", "count", "<", 10, "number"),
    ],
)
def test_a_condition_is_read_as_column_operator_value(text, column, op, value, kind):
    c = parse(text)
    assert (c.column, c.op, c.value, c.kind) == (column, op, value, kind)
    assert parse(c.name) == c, "its name is its canonical text, which reads back as itself"


def test_the_name_spells_every_literal_one_way():
    assert parse("a=='x'").name == 'a == "x"'
    assert parse("a in [1,2]").name == "a in [1, 2]"
    assert parse("a == true").name == "a == true" and parse("a != null").name == "a != null"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("is_truncated = false", "cannot read"),
        ("language == eng_Latn", "eng_Latn is not a value"),
        ("x >", "expected COLUMN OP VALUE"),
        ("== 3", "expected COLUMN OP VALUE"),
        ("x ~ 3", "cannot read"),
        ("x == 3 4", "one value after the operator"),
        ("x in 3", "in takes a list"),
        ("x in []", "holds no value"),
        ("x in [1,]", "ends with a comma"),
        ("x in [1 2]", "separated by commas"),
        ("x in [1, 'a']", "mixes number and string"),
        ("x >= null", "null is compared with == or != only"),
        ("x == 'a|b'", "'|'"),
        (f"{TOKENS} == 'a'", "a number of tokens"),
        ("x == 1e999", "not a finite number"),
        ("x == 'open", "cannot read"),
        ("x > 99999999999999999999999", "beyond"),
        ("x in [1, -9007199254740993]", "beyond"),
        # ASCII only: int() and float() read other scripts' digits, and re's \d and \s match them
        ("x == \u0663", "'\u0663' is not an ASCII digit"),
        ("x >= \uff10.\uff15", "'\uff10' is not an ASCII digit"),
        ("x == 1\u0663", "not an ASCII digit"),
        ("x\u00a0== 3", "cannot read '\\xa0== 3'"),
        # one line of printable text: the card shows it in a table's row and its command in a fenced block
        ("x ==\n3", "line break or control character"),
        ('x == "a\nb"', "'\\n': a line break"),
        ("x == 'a\u2028b'", "line break or control character"),
        ("x == 'a\x1b[31m'", "line break or control character"),
        # a direction override: the card's row would read as another text than the one given
        ("url == '\u202egnp.exe'", "'\\u202e': a direction override"),
        ("x == 'a\u2067b'", "direction override"),
        # a byte not in UTF-8 (Python keeps it in argv as a lone surrogate): pyarrow raised on it mid-run
        ("x == 'a\udc85b'", "'\\udc85': a byte that is not UTF-8"),
        ("x\udcff == 1", "not UTF-8"),
    ],
)
def test_a_malformed_condition_is_one_error_naming_it(text, problem):
    with pytest.raises(ConditionError) as e:
        parse(text)
    assert str(e.value).startswith(f"--keep {text!r}: ") and problem in str(e.value)


def test_the_default_list_is_the_cards_four_conditions_and_the_text():
    assert [c.text for c in conditions.conditions({})] == [
        'language == "eng_Latn"', 'page_average_lid == "eng_Latn"', "page_average_lid_score >= 0.9",
        "token_count >= 1", 'text != ""']
    assert [c.name for c in conditions.conditions({})] == [
        "language", "page_average_lid", "lid_score", "token_count", "empty_text"]


def test_the_shorthands_edit_the_default_list():
    fineweb = {"language": "en", "language_fields": "language", "lid_score_field": "language_score",
               "lid_threshold": 0.65}
    assert [c.text for c in conditions.conditions(fineweb)][:3] == [
        'language == "en"', "language_score >= 0.65", "token_count >= 1"]
    off = conditions.conditions({"language": "none", "token_count_field": "none"})
    assert [c.name for c in off] == ["empty_text"]
    keep = conditions.conditions({"keep": ["is_truncated == false"]})
    assert keep[-1] == Condition("is_truncated == false", "is_truncated", "==", False, "boolean",
                                 "--keep 'is_truncated == false'")


def test_two_conditions_under_one_name_are_refused():
    with pytest.raises(ValueError, match="given twice"):
        conditions.conditions({"keep": ["a == 1", "a==1"]})
    with pytest.raises(ValueError, match="--language-fields .*given twice"):
        conditions.conditions({"language_fields": "lid_score"})


def test_the_card_says_each_condition():
    said = conditions.describe(conditions.conditions({"keep": [
        "is_truncated == false", "full_doc_lid_score >= 0.8", "dump in ['a', 'b']", "x != null", f"{TOKENS} < 9"]}))
    assert said == [
        "`language` and `page_average_lid` are `eng_Latn`", "`page_average_lid_score` ≥ 0.9", "`token_count` ≥ 1",
        "the text is not empty", "`is_truncated` is `false`", "`full_doc_lid_score` ≥ 0.8",
        "`dump` is one of `a`, `b`", "`x` is not `null`", "the length in tokens (EOS included) < 9"]


def test_a_value_is_said_in_a_code_span_whatever_it_holds():
    said = conditions.describe([parse("x >= '<b>'"), parse("y in ['`', 'a``b']"), parse("z <= 2")])
    assert said == ["`x` ≥ `<b>`", "`y` is one of `` ` ``, ``` a``b ```", "`z` ≤ 2"]


def test_an_empty_or_blank_string_is_said_with_its_quotes():
    """No code span holds nothing (a lone `` is no span): an empty value opened a span that the
    next condition's empty value closed, and the card's row showed the conditions between as code.
    A value of spaces alone is quoted too, so that it is seen."""
    from markdown_it import MarkdownIt

    said = conditions.describe([parse("url == ''"), parse("dump != ''"), parse("x in ['', '  ']")])
    tokens = MarkdownIt("commonmark").parseInline(", ".join(said))[0].children
    assert [t.content for t in tokens if t.type == "code_inline"] == ["url", '""', "dump", '""', "x", '""', '"  "']


def test_a_string_that_reads_as_another_value_is_said_with_its_quotes():
    """``x == "null"`` keeps the string null, ``x == null`` the missing values: the card said both
    as `null`. A string that would read, bare, as null, a boolean or a number keeps its quotes."""
    from markdown_it import MarkdownIt

    said = conditions.describe([parse('a == "null"'), parse("b == null"), parse("c != 'true'"), parse("d != true"),
                                parse('e == "3"'), parse("f == 3"), parse("g in ['null', null, '-1.5e3', 'n']")])
    tokens = MarkdownIt("commonmark").parseInline(", ".join(said))[0].children
    assert [t.content for t in tokens if t.type == "code_inline"] == [
        "a", '"null"', "b", "null", "c", '"true"', "d", "true", "e", '"3"', "f", "3",
        "g", '"null"', "null", '"-1.5e3"', "n"]


def test_a_field_flag_naming_a_column_with_a_line_break_is_refused():
    with pytest.raises(ValueError, match="--lid-score-field .*line break"):
        conditions.conditions({"lid_score_field": "a\nb"})
    with pytest.raises(ValueError, match="--lid-score-field .*not UTF-8"):
        conditions.conditions({"lid_score_field": "a\udc85b"})


@pytest.mark.parametrize(("language", "problem"), [("eng\nx", "line break"), ("eng\x1b[2J", "control character"),
                                                 ("eng\udc85", "not UTF-8")])
def test_a_language_flag_that_is_no_line_of_text_is_refused(language, problem):
    """--language is the value of the language conditions: a line break in it broke the card's
    row, and a byte that is not UTF-8 raised in pyarrow as the job ran."""
    with pytest.raises(ValueError, match=f"language == .*{problem}"):
        conditions.conditions({"language": language})


@pytest.mark.parametrize("text", ["eng_Latn", "a`b", "`", "``x`", "a``b```c", " a ", "<script>alert(1)</script>",
                                  "*a* _b_ [l](u) <u@v.w>", "&amp;"])
def test_a_code_span_shows_its_text_literally(text):
    """CommonMark, as the Hub renders a card: the span is one code element holding ``text``."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parseInline(f"x {conditions.code_span(text)} y")[0].children
    assert [(t.type, t.content) for t in tokens] == [("text", "x "), ("code_inline", text), ("text", " y")]


def test_the_stats_lines_read_back_typed():
    values = {"language": "eng_Latn", "lid_threshold": 0.9, "min_token_count": 1, "language_fields": "lang",
              "lid_score_field": "page_average_lid_score", "keep": ("x == 'a, b'", "y >= 2")}
    head, tail = conditions.stats_lines(values)
    assert head == [("language", "eng_Latn"), ("lid_threshold", "0.9"), ("min_token_count", "1")]
    assert tail == [("language_fields", "lang"), ("keep", '["x == \'a, b\'", "y >= 2"]')]
    back = conditions.from_stats(dict(head + tail))
    assert back == {"language": "eng_Latn", "lid_threshold": 0.9, "min_token_count": 1, "language_fields": "lang",
                    "keep": ("x == 'a, b'", "y >= 2")}
    assert conditions.conditions(back) == conditions.conditions(values)


@pytest.mark.parametrize("text", ["x > 9007199254740992", "x in [1, -9007199254740992]", "x < 1e300"])
def test_every_number_a_condition_takes_is_one_the_filter_compares(text):
    """A number read as a condition is compared as a float64 (filter.holds): one a float64 does
    not hold exactly failed in the workers with Arrow's traceback, after the launch took it."""
    import pyarrow as pa

    from transforms.bucketed.filter import holds

    assert holds(parse(text), pa.array([1.0, None])).tolist()[1] is False


@pytest.mark.parametrize("line", ["5", "null", "[1]", '{"a": 1}', '"x == 1"'])
def test_a_damaged_keep_line_is_a_value_error(line):
    """A tree's stats are read by stats, decode, verify and a re-run: a keep line that is JSON but
    not a list of texts failed in them with a TypeError or AttributeError traceback (or was read
    as the characters of a string), where a damaged stats file says so in one line."""
    settings = {"language": "eng_Latn", "lid_threshold": "0.9", "min_token_count": "1", "keep": line}
    with pytest.raises(ValueError, match="keep"):
        conditions.from_stats(settings)
