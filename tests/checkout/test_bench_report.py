"""tests/bench/report.py: ``make bench`` rewrites its own sections of BENCHMARKS.md and keeps the rest,
the sections added by hand among them, where they stand and byte for byte."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import report  # noqa: E402

OLD = """# Benchmarks

Measured 2026-11-30 by `make bench`.

| row | tokens |
|---|---:|
| raw | 1 |

## Targets

| target | measured | |
|---|---|---|
| old target | 1 | **met** |

## 20 MB documents without whitespace

old long rows

## Resume after a kill (issue 15)

Added by hand: a kill at 80%.

### Why

```text
## not a heading: inside a fenced block
```

## Tokenizer backends

old backends

## Scale rehearsal: 2,000,000 short documents

old scale rows

### Targets (scale rehearsal)

old scale targets

## Moved from the README

Hand-written figures.
"""

# What a full run writes, in its order (run_bench.main): the head, then its sections.
RUN = """# Benchmarks

Measured 2026-12-01 by `make bench`.

## Targets

new targets

## 2 MB documents without whitespace

new long rows

## Tokenizer backends

new backends

## Scale rehearsal: 100,000 short documents

new scale rows
"""


def sections_of(text: str) -> dict[str, str]:
    return {lines[0]: "\n".join(lines) for lines in report.split(text)[1]}


def test_a_full_run_replaces_its_sections_and_keeps_the_hand_added_ones_in_place():
    head, sections = report.split(RUN)
    text = report.splice(OLD, sections, head)
    assert text.startswith("# Benchmarks\n\nMeasured 2026-12-01 by `make bench`.\n\n## Targets\n\nnew targets\n")
    assert [lines[0] for lines in report.split(text)[1]] == [
        "## Targets", "## 2 MB documents without whitespace", "## Resume after a kill (issue 15)",
        "## Tokenizer backends", "## Scale rehearsal: 100,000 short documents", "## Moved from the README"]
    old, new = sections_of(OLD), sections_of(text)
    for hand in ("## Resume after a kill (issue 15)", "## Moved from the README"):
        assert new[hand].rstrip("\n") == old[hand].rstrip("\n")
    assert "## not a heading: inside a fenced block" in new["## Resume after a kill (issue 15)"]
    # A section's ### subsections are its own: the old scale targets went with the old scale rows.
    assert "old" not in "".join(v for k, v in new.items() if k not in ("## Resume after a kill (issue 15)",
                                                                         "## Moved from the README"))
    assert report.splice(text, sections, head) == text  # a second run of the same figures changes nothing


def test_a_section_the_file_lacks_goes_after_the_one_before_it_in_the_run():
    text = report.splice("# Benchmarks\n\n## Targets\n\nt\n\n## Mine\n\nby hand\n", [["## Long documents", "", "l"],
                                                                                    ["## Targets", "", "T"],
                                                                                    ["## Later", "", "x"]])
    assert text == "# Benchmarks\n\n## Long documents\n\nl\n\n## Targets\n\nT\n\n## Later\n\nx\n\n## Mine\n\nby hand\n"
    assert report.splice("", [["## Scale rehearsal: 5 short documents", "", "s"]]) == (
        "# Benchmarks\n\n## Scale rehearsal: 5 short documents\n\ns\n")


def test_the_checkout_benchmarks_survive_an_only_scale_run_but_for_that_section(tmp_path):
    """run_bench.write_sections, as ``--only scale`` calls it, on a copy of the checkout's BENCHMARKS.md."""
    import run_bench

    out = tmp_path / "BENCHMARKS.md"
    before = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    out.write_text(before, encoding="utf-8")
    scale = ["## Scale rehearsal: 100 short documents", "", "new scale rows"]
    run_bench.write_sections(out, [scale])
    after = out.read_text(encoding="utf-8")
    old, new = sections_of(before), sections_of(after)
    assert list(new) == [("## Scale rehearsal: 100 short documents" if k.startswith("## Scale rehearsal: ") else k)
                         for k in old]
    assert {k: v for k, v in new.items() if "Scale" not in k} == {k: v for k, v in old.items() if "Scale" not in k}
    assert report.split(after)[0] == report.split(before)[0]
    assert new["## Scale rehearsal: 100 short documents"].rstrip("\n") == "\n".join(scale)
