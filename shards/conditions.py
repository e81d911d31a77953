"""Conditions: what a document must satisfy to be kept, as data.

A job that filters documents keeps one when every condition of its list holds ("all conditions
required"); a document that fails some is dropped and counted under the name of the first it
fails. The list is written once and read by everything that says or checks the filter: the
filter step (transforms/bucketed/filter.py evaluates it on whole Arrow batches), the reader (the
columns it names, each read as its kind), the stats and their text, dataset_stats.json, the card
and verify. No condition has code of its own.

A condition is ``COLUMN OP VALUE`` (``--keep``, repeatable):

- COLUMN: a bare name (ASCII letters, digits, ``_``, ``.``, ``-``, not starting with a digit or ``-``)
  is a column of the input; ``id`` and ``text`` are the document's id and text, whatever
  --id-field and --text-field name. ``@tokens`` is the document's length in tokens as stored
  (EOS included, the manifest's processed_token_count), checked once it is tokenized: no input
  column can be spelled so, so it never clashes with one (FinePDFs has its own ``token_count``).
- OP: ``==``, ``!=``, ``>=``, ``>``, ``<=``, ``<``, or ``in [V, V, ...]``.
- VALUE: a number (``3``, ``-0.5``, ``1e-3``: the digits 0-9 only; an integer beyond ±2**53,
  which a float64 does not hold exactly, is refused), ``true``/``false``, ``null``, or a string
  quoted with ``"`` or ``'`` (a backslash escapes the quote or itself). A bare word is no string.

Spaces and tabs separate the parts. A condition is one line of text (no line break or control
character, no byte that is not UTF-8): the card shows each in a table's row, as code (code_span),
and the command in a block.

Nulls: a null value fails every comparison (``x >= 0.9`` drops a null ``x``: no threshold can
judge it), but ``x == null`` keeps exactly the nulls, ``x != null`` the others, and ``x in [...,
null]`` keeps nulls too. A column a condition compares with a number is read as float64 (a float32
value as the decimal it was written as, transforms/inputs/arrow.py); with a string, as a string;
with true/false, as a boolean: another type is refused at launch, naming the condition.

The default list is the FinePDFs-Edu card's: each language field equals the language, the LID
score is at least the threshold, the source token count at least the minimum, and the text is not
empty. Its shorthand flags (SHORTHANDS) edit that list; their conditions keep the drop names trees
always had (a language field's own name, ``lid_score``, ``token_count``, ``empty_text``), and a
``--keep`` condition is counted under its own text, as ``render`` spells it.

Adding an operator: OPERATORS here (and a word in docs/jobs-and-flags.md); its pyarrow.compute
function does the rest.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import NamedTuple

TOKENS = "@tokens"  # the document's length in tokens, EOS included
OFF = "none"  # the shorthand value that removes its conditions
# Each operator, as pyarrow.compute's function that evaluates it (filter.py), and as the card says it.
OPERATORS: dict[str, tuple[str, str]] = {
    "==": ("equal", "is"),
    "!=": ("not_equal", "is not"),
    ">=": ("greater_equal", "≥"),
    ">": ("greater", ">"),
    "<=": ("less_equal", "≤"),
    "<": ("less", "<"),
    "in": ("is_in", "is one of"),
}
# The kind a column is read as, by the type of the value it is compared with.
_KINDS = {str: "string", bool: "boolean", int: "number", float: "number", type(None): "any"}

# The shorthand flags of the default list, with their defaults: the FinePDFs schema's.
SHORTHANDS: dict[str, object] = {
    "language": "eng_Latn",
    "lid_threshold": 0.90,
    "min_token_count": 1,
    "language_fields": "language,page_average_lid",
    "lid_score_field": "page_average_lid_score",
    "token_count_field": "token_count",
}
KEEP = "keep"  # the setting that holds the --keep conditions, as their texts
# The shorthands dataset_stats.txt always writes (after raw_documents), and those it writes only
# when they differ from their defaults (at its end, with --keep's list as JSON).
STATS_HEAD = ("language", "lid_threshold", "min_token_count")
STATS_TAIL = ("language_fields", "lid_score_field", "token_count_field")


class ConditionError(ValueError):
    """A condition that cannot be read or used; the message names it."""

    def __init__(self, text: str, problem: str):
        super().__init__(f"--keep {text!r}: {problem}")


class Condition(NamedTuple):
    """One condition: the name its drops are counted under, the column, the operator, the value
    (a tuple for ``in``), the kind the column is read as (transforms/inputs/fields.py), and the
    flag that made it (for a message about its column)."""

    name: str
    column: str
    op: str
    value: object
    kind: str
    flag: str = ""

    @property
    def text(self) -> str:
        return render(self)


# The operators spelled with symbols, longest first (">=" before ">"), then the list's punctuation.
_SYMBOLS = "|".join(re.escape(s) for s in sorted((o for o in OPERATORS if not o.isalpha()), key=len, reverse=True))
# ASCII only: re's \d and \s are Unicode-wide, and int() reads '٣' or '３' as 3 (the name and the
# card would say another text than the one given); a separator is a space or a tab.
_NUMBER = r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_TOKEN = re.compile(r"""[ \t]*(?:(?P<num>""" + _NUMBER + r""")
    |(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<op>""" + _SYMBOLS + r"""|\[|\]|,)
    |(?P<word>@tokens|[A-Za-z_][A-Za-z0-9_.\-]*)
    )""", re.VERBOSE)
EXACT_INT = 2**53  # the largest integer every integer up to which a float64 holds exactly
_WORDS = {"true": True, "false": False, "null": None}


# The embeddings, overrides and isolates of Unicode's bidirectional algorithm: in a value, they make
# the card's row display as another text than the one given (U+202E turns the rest around).
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _control(text: str, what: str) -> str | None:
    """Why ``text`` cannot be in ``what``, or None: for its first line break or control character
    (a tab is a space), as the card shows a condition on one line of a table, and its command in
    a fenced block, which a line break would end or break open; or for a lone surrogate, which is
    how Python keeps an argument's byte that is not UTF-8, and which no file can be written with
    (pyarrow raised on it as the job ran)."""
    c = next((c for c in text if c != "\t" and (unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")
                                                or c in _BIDI_CONTROLS)), None)
    if c is None:
        return None
    if unicodedata.category(c) == "Cs":
        return f"{c!r}: a byte that is not UTF-8 cannot be in {what}"
    if c in _BIDI_CONTROLS:
        return f"{c!r}: a direction override cannot be in {what} (the card would show the rest reversed)"
    return f"{c!r}: a line break or control character cannot be in {what}"


def _tokens(text: str) -> list[tuple[str, str]]:
    """(type, spelling) of each token of ``text``."""
    if _control(text, "a condition"):
        raise ConditionError(text, _control(text, "a condition"))
    out, pos = [], 0
    text = text.rstrip(" \t")
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise _unreadable(text, text[pos:].lstrip(" \t"))
        out.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    return out


def _unreadable(text: str, rest: str) -> ConditionError:
    """The error for the first character of ``rest`` that starts no token."""
    if rest[0].isdigit():
        return ConditionError(text, f"{rest[0]!r} is not an ASCII digit: a number is written with 0-9")
    return ConditionError(text, f"cannot read {rest[:20]!r}; expected COLUMN OP VALUE, OP one of "
                          f"{', '.join(OPERATORS)}")


def _literal(text: str, token: tuple[str, str]):
    kind, spelled = token
    if kind == "num":
        value = float(spelled) if any(c in spelled for c in ".eE") else int(spelled)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConditionError(text, f"{spelled} is not a finite number")
        if isinstance(value, int) and abs(value) > EXACT_INT:
            # The filter compares as float64 (filter.holds), which Arrow refuses for such an int.
            raise ConditionError(text, f"{spelled} is beyond the integers a float64 holds exactly (±2**53)")
        return value
    if kind == "str":
        return re.sub(r"\\(.)", r"\1", spelled[1:-1])
    if kind == "word" and spelled in _WORDS:
        return _WORDS[spelled]
    raise ConditionError(text, f"{spelled} is not a value (a number, true, false, null or a quoted string: "
                         f"\"{spelled}\")")


def _list(text: str, rest: list[tuple[str, str]]) -> tuple:
    if len(rest) < 2 or rest[0] != ("op", "[") or rest[-1] != ("op", "]"):
        raise ConditionError(text, "in takes a list: in [V, V, ...]")
    items, inner = [], rest[1:-1]
    for i, token in enumerate(inner):
        if i % 2:
            if token != ("op", ","):
                raise ConditionError(text, "the list's values are separated by commas")
        else:
            items.append(_literal(text, token))
    if not items or len(inner) % 2 == 0:
        raise ConditionError(text, "the list holds no value, or ends with a comma")
    return tuple(items)


def _kind(text: str, column: str, op: str, value) -> str:
    """What the column is read as, from the value(s) it is compared with."""
    values = value if op == "in" else (value,)
    kinds = {_KINDS[type(v)] for v in values} - ({"any"} if op == "in" else set())
    if len(kinds) > 1:
        raise ConditionError(text, f"the list mixes {' and '.join(sorted(kinds))} values")
    kind = kinds.pop() if kinds else "any"
    if kind == "any" and op not in ("==", "!=", "in"):
        raise ConditionError(text, f"null is compared with == or != only, not {op}")
    if column == TOKENS and kind != "number":
        raise ConditionError(text, f"{TOKENS} is a number of tokens")
    return kind


def parse(text: str) -> Condition:
    """The condition ``text`` spells, named by its canonical text; a ConditionError otherwise."""
    tokens = _tokens(text)
    if len(tokens) < 3 or tokens[0][0] != "word" or tokens[0][1] in _WORDS or tokens[0][1] == "in":
        raise ConditionError(text, "expected COLUMN OP VALUE (e.g. 'is_truncated == false')")
    column, op = tokens[0][1], tokens[1][1]
    if op == "in":
        value = _list(text, tokens[2:])
    elif op in OPERATORS:
        if len(tokens) != 3:
            raise ConditionError(text, "one value after the operator")
        value = _literal(text, tokens[2])
    else:
        raise ConditionError(text, f"unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
    kind = _kind(text, column, op, value)
    condition = Condition("", column, op, value, kind)
    name = render(condition)
    if "|" in name:
        raise ConditionError(text, "a '|' cannot be in a drop reason's name")
    return condition._replace(name=name, flag=f"--keep {name!r}")


def _spell(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_spell(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def render(condition: Condition) -> str:
    """The canonical text of a condition: ``column op value``, strings in double quotes."""
    return f"{condition.column} {condition.op} {_spell(condition.value)}"


def defaults(values: Mapping[str, object]) -> list[Condition]:
    """The default list as the shorthands in ``values`` edit it (a missing one: its default);
    ``none`` for the language removes the language and score conditions, for a field its own."""
    def value(name):
        return values.get(name, SHORTHANDS[name])

    language, out = str(value("language")), []
    if language != OFF:
        fields = [f.strip() for f in str(value("language_fields")).split(",") if f.strip()]
        out += [Condition(field, field, "==", language, "string", "--language-fields (or --language none)")
                for field in fields]
        if value("lid_score_field") != OFF:
            out.append(Condition("lid_score", str(value("lid_score_field")), ">=", float(value("lid_threshold")),
                                 "probability", "--lid-score-field (or none)"))
    if value("token_count_field") != OFF:
        out.append(Condition("token_count", str(value("token_count_field")), ">=", int(value("min_token_count")),
                             "integer", "--token-count-field (or none)"))
    return [*out, Condition("empty_text", "text", "!=", "", "string", "--text-field")]


def conditions(values: Mapping[str, object]) -> tuple[Condition, ...]:
    """The whole list the settings ``values`` make: the default list, then each ``keep`` text in
    its order. A ValueError for two conditions counted under one name."""
    out = [*defaults(values), *(parse(text) for text in values.get(KEEP) or ())]
    names = [c.name for c in out]
    for c in out:
        if not c.name or c.name != c.name.strip() or "|" in c.name:
            raise _refused(c, f"{c.name!r} cannot name a drop reason (no '|' or space at either end)")
        if _control(c.column, "a field's name"):
            raise _refused(c, _control(c.column, "a field's name"))
        if isinstance(c.value, str) and _control(c.value, "a value"):  # a shorthand's (--language)
            raise _refused(c, _control(c.value, "a value"))
        if names.count(c.name) > 1:
            raise _refused(c, f"the name {c.name!r} is given twice (a --keep repeated, or a language "
                                 "field named as another drop reason)")
    return tuple(out)


def _refused(condition: Condition, problem: str) -> ValueError:
    """The error of a condition the list cannot hold, naming it and the flag that made it."""
    if condition.flag.startswith("--keep"):
        return ValueError(f"{condition.flag}: {problem}")
    return ValueError(f"{condition.flag}: the condition {condition.text!r}: {problem}")


def describe(conds: Sequence[Condition]) -> list[str]:
    """The card's words for each condition, in order; ``==`` conditions with the same value next
    to each other are said in one (``a`` and ``b`` are ``v``)."""
    out: list[str] = []
    runs: list[list[Condition]] = []
    for c in conds:
        if runs and c.op == "==" and runs[-1][-1].op == "==" and runs[-1][-1].value == c.value:
            runs[-1].append(c)
        else:
            runs.append([c])
    for run in runs:
        c = run[0]
        if c.column == "text" and c.op == "!=" and c.value == "":
            out.append("the text is not empty")
            continue
        names = " and ".join("the length in tokens (EOS included)" if r.column == TOKENS else code_span(r.column)
                             for r in run)
        word = OPERATORS[c.op][1]
        if len(run) > 1:
            word = "are"
        value = (", ".join(code_span(_bare(v)) for v in c.value) if c.op == "in" else
                 code_span(_bare(c.value)) if c.op in ("==", "!=") or isinstance(c.value, str) else _bare(c.value))
        out.append(f"{names} {word} {value}")
    return out


def _bare(value) -> str:
    """A value as the card says it: a string as it is, unless it is empty or blank, which is said
    with its quotes (no code span can hold nothing, and a blank one would show as no value), or
    unless it reads as another value: ``"null"``, ``"true"`` or ``"3"`` said bare would be the
    null, a boolean or a number (``x == "null"`` and ``x == null`` keep other documents)."""
    if isinstance(value, str) and value.strip() and not _reads_as_other_value(value):
        return value
    return _spell(value)


def _reads_as_other_value(text: str) -> bool:
    """Whether ``text``, unquoted, would be read as a value that is no string."""
    bare = text.strip()
    return bare in _WORDS or re.fullmatch(_NUMBER, bare) is not None


def one_line(text: str) -> bool:
    """Whether ``text`` is one line of text (no line break, control character, direction override
    or byte that is not UTF-8; a tab is a space), as a table's row and a code span can show it."""
    return _control(text, "") is None


def code_span(text: str) -> str:
    """``text`` as a Markdown code span, which shows it literally (no markup, no HTML inside one):
    `text`, or, when it holds a backtick or starts and ends with a space, fenced by one backtick
    more than its longest run and padded with a space each side, which CommonMark strips again."""
    if "`" not in text and not (text.startswith(" ") and text.endswith(" ")):
        return f"`{text}`"
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def stats_lines(values: Mapping[str, object]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The settings lines of dataset_stats.txt that make the list: those always written (after
    raw_documents), then those written only when not the default (at the end; --keep as JSON)."""
    head = [(k, repr(float(values[k])) if isinstance(SHORTHANDS[k], float) else str(values[k])) for k in STATS_HEAD]
    tail = [(k, str(values[k])) for k in STATS_TAIL if k in values and str(values[k]) != SHORTHANDS[k]]
    if values.get(KEEP):
        tail.append((KEEP, json.dumps(list(values[KEEP]), ensure_ascii=False)))
    return head, tail


def from_stats(settings: Mapping[str, str]) -> dict[str, object]:
    """The settings a dataset_stats.txt records (stats_lines), typed as the flags give them; a
    shorthand it does not record has its default."""
    out = {k: type(SHORTHANDS[k])(settings[k]) for k in STATS_HEAD}  # a KeyError when one is missing
    out.update({k: type(SHORTHANDS[k])(settings[k]) for k in STATS_TAIL if k in settings})
    if KEEP in settings:
        out[KEEP] = _keep_texts(settings[KEEP])
    return out


def _keep_texts(line: str) -> tuple[str, ...]:
    """The --keep texts of a stats line (a JSON list of strings); a ValueError for another line,
    so a damaged file is reported as one, not met later as a TypeError."""
    texts = json.loads(line)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{KEEP}: {line[:40]!r} is not a JSON list of conditions' texts")
    return tuple(texts)


def record(values: Mapping[str, object]) -> dict[str, object]:
    """dataset_stats.json's ``filter``: the head shorthands typed, and the --keep texts when any."""
    out = {k: type(SHORTHANDS[k])(values[k]) for k in STATS_HEAD}
    if values.get(KEEP):
        out[KEEP] = list(values[KEEP])
    return out
