"""The lines a job's summary shares: the documents read, kept and dropped, the wall time, and the
stats the job published, read back from its output.
"""

from __future__ import annotations

from shards import storage, tree


def drop_lines(raw: int, kept: int, drops: dict[str, int]) -> list[str]:
    lines = [f"documents read {raw:,}, kept {kept:,}, dropped {sum(drops.values()):,}"]
    lines += [f"  dropped ({reason}): {n:,}" for reason, n in drops.items()]
    return lines


def timing_lines(tokens: int, seconds: float, output: str) -> list[str]:
    rate = tokens / seconds if seconds > 0 else 0.0
    return [f"wall time {seconds:.1f} s, {rate:,.0f} tokens/s", f"output: {output}"]


def read_stats(output: str):
    """The stats a finished tree published (DatasetStats or ScaffoldStats)."""
    return tree.OutputTree.open(storage.normalize(output)).stats()
