"""What a job's settings dataclass says of a field beyond its default: the help of the flag that sets it.

A job's settings (``transforms/*/settings.py``) is the one place for its defaults and checks; its
flags are generated from it (pipelines/flags.py ``add_setting_flags``): the flag is the field's name
with dashes, its default the field's, its type the default's (``str`` for None, an on/off switch
for a bool), its choices and help the ``setting`` that declared it::

    @dataclasses.dataclass(frozen=True)
    class Settings:
        input: str
        seed: int = setting(0, "seed of the order inside each partition")

A field declared without ``setting`` has no generated flag (the job adds its own, or none). A
field whose default is ``REQUIRED`` is a required flag; ``flags`` spells the flag another way
(``("--id",)``, or an alias), and ``flags=()`` makes it a positional argument (``many``: one or more
values, a tuple of them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

HELP, CHOICES, SPELLED, FLAGS, METAVAR, MANY = "help", "choices", "spelled", "flags", "metavar", "many"
REPEATED = "repeated"
REQUIRED = dataclasses.MISSING  # the default of a field whose flag must be given


def setting(default: Any, help: str, choices: Sequence[str] | None = None, spelled: type | None = None, *,
            flags: Sequence[str] | None = None, metavar: str | None = None, many: bool = False,
            repeated: bool = False):
    """A settings field with its default and its flag's ``help`` and ``choices``; ``spelled``: the
    type the flag is parsed as when it differs from the field's (``float`` for an int given as
    1.5e9, converted to int before the settings are built). ``flags``: the flag's spellings when
    they are not the field's name with dashes (``()``: a positional argument); ``metavar``: the
    value's name in --help; ``many``: one or more values."""
    metadata = {HELP: help, CHOICES: tuple(choices) if choices is not None else None, SPELLED: spelled,
                FLAGS: tuple(flags) if flags is not None else None, METAVAR: metavar, MANY: many,
                REPEATED: repeated}
    return dataclasses.field(default=default, metadata=metadata)


def flag_fields(settings_cls) -> dict[str, dataclasses.Field]:
    """The fields of ``settings_cls`` that have a flag, by name."""
    return {f.name: f for f in dataclasses.fields(settings_cls) if HELP in f.metadata}


def spelled_as_float(settings_cls) -> tuple[str, ...]:
    """The int fields whose flags are given as floats (1.5e9)."""
    return tuple(name for name, f in flag_fields(settings_cls).items() if f.metadata[SPELLED] is float)


# The settings more than one job has, each stated once: name -> (default, help, choices).
SHARED = {
    "on_bad_record": ("fail", "a record that cannot be read (bad JSON or UTF-8, null or mistyped field, bad id): "
                      "stop naming it, or drop and count it", ("fail", "skip")),
    # The dataset card's metadata (shards/card.py) and how inputs are fingerprinted in it. For
    # FinePDFs (ODC-By): --license odc-by --source-dataset HuggingFaceFW/finepdfs-edu.
    "license": (None, "the card's license (a Hub license id, e.g. odc-by for FinePDFs); default: the hub input's "
                "card's, else unknown", None),
    "source_dataset": (None, "the card's source_datasets, comma-separated Hub ids (e.g. HuggingFaceFW/finepdfs-edu); "
                       "default: the hub input's dataset, else none", None),
    "input_sha256": (False, "fingerprint local input files by their sha256 (read once more at launch) rather than "
                     "their mtime, so that a copy of the same bytes is recorded the same", None),
}
CARD_FLAGS = ("license", "source_dataset", "input_sha256")


def shared(name: str):
    """The settings field ``name`` of SHARED."""
    default, help, choices = SHARED[name]
    return setting(default, help, choices)
