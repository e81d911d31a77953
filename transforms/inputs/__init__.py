"""Reading the input: which files ``--input`` names, and each input format behind one interface.

    discover.py      a file, a directory or a glob -> the input files (the rules, numbered there)
    registry.py      the input formats: which suffix is read by which format (no Beam, no Arrow)
    formats.py       InputFormat, the interface every format has: suffixes, plan, read, count rows
    parquet.py       parquet: a unit per row group, the footer checked at launch, Arrow batches
    jsonl.py         JSON lines (.jsonl, .ndjson, .json): a unit per file, one record a line
    json_text.py     JSON text (.json with json_values): one object, an array, or objects in a row
    compression.py   .gz, .zst, .bz2, .xz: a file's bytes decompressed as its suffix says
    fields.py        ReadConfig (which fields are read) and the check of one record's values
    arrow.py         Arrow columns normalized into DocBatches, and DocBatches of checked rows
    units.py         InputUnit (one piece of reading work), the file's fingerprint, planned work
    plan.py          the input planned into units at launch, before Beam is imported (plan_input)
    read.py          read_batches, ReadUnitFn and ReadDocuments (the Beam step)

Only read.py imports Beam; discover.py, registry.py, units.py, plan.py and fields.py import no Arrow either,
so the CLI can say an input matches nothing before it loads either, or the tokenizer.
"""
