"""Beam's flag names, read from its source files without importing Beam (which takes seconds), and
a flag's value read off a command line.

A flag Beam knows is declared in a ``_add_argparse_args`` of some module of the apache_beam
package, spelled there as a string literal (``'--runner'``). So a flag whose quoted spelling
appears in no Beam source file is certainly one Beam does not know: a typo can be refused
before Beam is imported. The converse does not hold (a spelling may appear in a file that is
not an options class), so a flag found here is left to Beam's own parser (pipelines/flags.py).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re

_QUOTED_FLAG = re.compile(rb"""['"](--[A-Za-z0-9_][A-Za-z0-9_-]*)['"]""")


@functools.cache
def _source_flags() -> tuple[frozenset[str], tuple[str, ...]] | None:
    """Every quoted ``--name`` in Beam's source files, and those of its options module (for a
    did-you-mean); None when Beam's source cannot be found (then nothing is judged here)."""
    spec = importlib.util.find_spec("apache_beam")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    everywhere: set[str] = set()
    options: list[str] = []
    for folder, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    found = {m.decode() for m in _QUOTED_FLAG.findall(f.read())}
            except OSError:
                return None  # an unreadable file may declare any flag
            everywhere |= found
            if path.endswith(os.path.join("options", "pipeline_options.py")):
                options = sorted(found)
    return frozenset(everywhere), tuple(options)


def surely_unknown(args: list[str]) -> list[str] | None:
    """The arguments in ``args`` that are flags Beam certainly does not know (``--name`` or
    ``--name=value`` whose name no Beam source file spells); None when Beam's source cannot be
    read. A value cannot begin with ``--`` (argparse takes it for a flag), so each is a flag."""
    found = _source_flags()
    if found is None:
        return None
    everywhere, _ = found
    flags = args[:args.index("--")] if "--" in args else args  # after "--", positional arguments
    return [arg for arg in flags if arg.startswith("--") and arg.split("=", 1)[0] not in everywhere]


def beam_flag_names() -> tuple[str, ...]:
    """The flags Beam's options module declares, for a did-you-mean (empty without its source)."""
    found = _source_flags()
    return () if found is None else found[1]


def beam_flag(args: list[str], name: str) -> str | None:
    """The value of Beam flag ``--name`` in ``args`` (the last one given), or None."""
    value = None
    for i, arg in enumerate(args):
        flag, eq, given = arg.partition("=")
        if flag == f"--{name}":
            value = given if eq else (args[i + 1] if i + 1 < len(args) else "")
    return value


def beam_options(name: str) -> type:
    """Beam's options class ``name`` (``StandardOptions``, ``PipelineOptions``, ...). Imported here, when a
    job has flags to read: a module that reads them (run_mode, progress, verify) stays free of Beam for --help."""
    from apache_beam.options import pipeline_options

    return getattr(pipeline_options, name)


def view(pipeline_options, name: str):
    """``pipeline_options`` seen as Beam's options class ``name``: ``view(options, "StandardOptions").runner``."""
    return pipeline_options.view_as(beam_options(name))
