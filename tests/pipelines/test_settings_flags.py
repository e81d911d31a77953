"""A job's flags are generated from its settings dataclass: one place for defaults, types and help."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import SAMPLE_PARQUET

from pipelines import bucketed, cli, decode, export, remove, scaffold, stats, train_bpe, verify
from shards import conditions
from transforms.bpe.settings import TrainBpeSettings
from transforms.bucketed.settings import DOCUMENT_FILTER, BucketedSettings
from transforms.core.settings import CHOICES, HELP, REQUIRED, flag_fields, setting
from transforms.scaffold.settings import ScaffoldSettings

JOBS = [(bucketed, BucketedSettings, []), (scaffold, ScaffoldSettings, []),
        (train_bpe, TrainBpeSettings, ["--merges", "10"])]


@pytest.mark.parametrize(("module", "settings_cls", "extra"), JOBS, ids=["bucketed", "scaffold", "train-bpe"])
def test_every_setting_with_a_help_is_a_flag_with_its_default_and_choices(module, settings_cls, extra):
    actions = {a.dest: a for a in module.make_parser()._actions}
    fields = flag_fields(settings_cls)
    assert len(fields) >= 10
    for name, field in fields.items():
        action = actions[name]  # the flag exists, spelled with dashes
        assert action.option_strings == [f"--{name.replace('_', '-')}"]
        default = tuple(action.default) if isinstance(action.default, list) else action.default  # --keep
        assert default == field.default and action.help == field.metadata[HELP]
        if field.metadata[CHOICES] is not None:
            assert list(action.choices) == list(field.metadata[CHOICES])
    # Parsed with no flag of its own, the job's settings are the dataclass's defaults.
    settings, _ = module.parse_args(["--input", str(SAMPLE_PARQUET), "--output", "out", *extra])
    for name, field in fields.items():
        assert getattr(settings, name) == field.default, name


def test_a_flag_parses_as_its_settings_type_and_a_float_spelled_int_is_an_int():
    settings, _ = bucketed.parse_args(["--input", str(SAMPLE_PARQUET), "--output", "out", "--max-shard-bytes", "1.5e6",
                                       "--lid-threshold", "0.5", "--partitions", "3", "--input-sha256"])
    assert settings.max_shard_bytes == 1_500_000 and isinstance(settings.max_shard_bytes, int)
    assert settings.lid_threshold == 0.5 and settings.partitions == 3 and settings.input_sha256 is True
    scaffold_settings, _ = scaffold.parse_args(["--input", str(SAMPLE_PARQUET), "--output", "out", "--annotate",
                                                "--shard-tokens", "2e3"])
    assert scaffold_settings.annotate is True and scaffold_settings.shard_tokens == 2000


def test_the_document_filter_defaults_are_stated_once():
    """The bucketed and train-bpe jobs and the conditions' shorthands have the same FinePDFs defaults."""
    for name, (default, _) in DOCUMENT_FILTER.items():
        assert BucketedSettings.__dataclass_fields__[name].default == default
        assert TrainBpeSettings.__dataclass_fields__[name].default == default
    for name, default in conditions.SHORTHANDS.items():
        assert DOCUMENT_FILTER[name][0] == default


def test_a_new_setting_is_a_new_flag(capsys):
    """What a new setting costs: its field. The flag, its default and help follow."""
    from pipelines import flags

    @dataclasses.dataclass(frozen=True)
    class Settings:
        input: str
        output: str
        shuffle_window: int = setting(8, "documents held to shuffle")
        fast: bool = setting(False, "go fast")

    p = flags.job_parser("toy", "a toy job")
    flags.add_setting_flags(p, Settings)
    parsed, rest = flags.parse_job_args(p, ["--input", "i", "--output", "o", "--shuffle_window", "3", "--fast"])
    assert (parsed.shuffle_window, parsed.fast, rest) == (3, True, [])
    with pytest.raises(SystemExit):
        p.parse_args(["--help"])
    assert "documents held to shuffle (default: 8)" in " ".join(capsys.readouterr().out.split())


def test_the_cli_says_a_bad_choice_of_a_generated_flag_in_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", "out", "--dtype", "int8"])
    assert stopped.value.code == 2
    assert "argument --dtype: invalid choice: 'int8' (choose from 'uint16', 'uint32')" in capsys.readouterr().err


# The commands over a finished tree: their settings, a command line of their required flags only,
# and how the settings object comes from it.
TOOLS = [
    (remove, remove.RemoveSettings, ["--output", "out", "--removal-list", "flagged.txt"], lambda a: a[0]),
    (verify, verify.VerifySettings, ["--output", "out"], lambda a: a[0]),
    (decode, decode.DecodeSettings, ["out"], lambda a: a),
    (export, export.ExportSettings, ["megatron", "--output", "out"], lambda a: a),
    (stats, stats.StatsSettings, ["--output", "out"], lambda a: a),
]


@pytest.mark.parametrize(("module", "settings_cls", "argv", "settings_of"), TOOLS,
                         ids=["remove", "verify", "decode", "export", "stats"])
def test_every_setting_of_a_tool_is_its_flag(module, settings_cls, argv, settings_of):
    actions = {a.dest: a for a in module.make_parser()._actions}
    fields = flag_fields(settings_cls)
    assert {f.name for f in dataclasses.fields(settings_cls)} == set(fields)  # every field has its flag
    for name, field in fields.items():
        action = actions[name]
        assert action.help == field.metadata[HELP]
        if field.default is REQUIRED:
            assert action.required or not action.option_strings
        else:
            assert action.default == field.default and not action.required
        assert list(action.choices or ()) == list(field.metadata[CHOICES] or ())
    settings = settings_of(module.parse_args(argv))
    assert isinstance(settings, settings_cls)
    for name, field in fields.items():
        if field.default is not REQUIRED:
            assert getattr(settings, name) == field.default, name


def test_a_tool_flag_spelled_its_own_way_sets_its_setting():
    assert decode.parse_args(["a.bin", "b.bin", "--id", "x", "--docs", "3"]) == decode.DecodeSettings(
        ("a.bin", "b.bin"), docs=3, doc_id="x")
    assert stats.parse_args(["--output", "out", "--val_fraction", "0.25"]).val_fraction == 0.25
    assert export.parse_args(["megatron", "--output", "out", "--mount", "/data/tree/"]).mount == "/data/tree"
    # A pipeline tool's settings, with --workers and an underscored flag, and Beam's flags beside them.
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    settings, beam_options = remove.parse_args(["--output", "out", "--removal_list", "f.txt", "--workers", "2"])
    assert settings == remove.RemoveSettings("out", "f.txt")
    assert beam_options.view_as(DirectOptions).direct_num_workers == 2
    assert beam_options.view_as(StandardOptions).runner == "FnApiRunner"
    settings, beam_options = verify.parse_args(["--output", "out", "--sample", "0.5", "--dry_run=True"])
    from apache_beam.options.pipeline_options import TestOptions

    assert settings.sample == 0.5 and beam_options.view_as(TestOptions).dry_run == "True"


@pytest.mark.parametrize(("argv", "line", "code"), [
    (["verify", "--output", "out", "--sample", "2"], "pretokenize verify: --sample must be within (0, 1], got 2.0", 2),
    (["stats", "--output", "out", "--bins", "0"], "pretokenize stats: error: --bins must be at least 1", 2),
    (["export", "megatron", "--output", "out", "--mount", "a b"],
     "pretokenize export: error: --mount 'a b': Megatron splits its data-args file on whitespace, so the mount "
     "point must be a path without spaces", 2),
    (["stats", "--output", "out", "--split", "test"],
     "pretokenize stats: error: argument --split: invalid choice: 'test' (choose from 'train', 'val', 'all')", 2),
    (["remove", "--output", "out"], "pretokenize remove: error: the following arguments are required: --removal-list",
     2),
    (["stats", "--output", "out", "--val-fraction", "2"],
     "pretokenize stats: error: --val-fraction must be at least 0 and below 1, got 2.0", 2),
    (["stats", "--output", "out", "--val-fraction", "nan"],
     "pretokenize stats: error: --val-fraction must be at least 0 and below 1, got nan", 2),
    (["decode", "out", "--docs", "-1"], "pretokenize decode: error: --docs must be >= 0", 2),
], ids=["verify-sample", "stats-bins", "export-mount", "stats-split", "remove-required", "stats-val-fraction",
        "stats-val-fraction-nan", "decode-docs"])
def test_a_tool_says_a_bad_value_in_one_line(capsys, argv, line, code):
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    assert status == code
    assert capsys.readouterr().err.strip().splitlines()[-1] == line


def _input_help(module) -> str:
    return next(a.help for a in module.make_parser()._actions if a.dest == "input")


@pytest.mark.parametrize("module", [bucketed, scaffold, train_bpe], ids=["bucketed", "scaffold", "train-bpe"])
def test_the_input_help_names_every_ending_the_registry_reads(module):
    from transforms.inputs.registry import PARQUET_SUFFIXES

    text = _input_help(module)
    for ending in (*PARQUET_SUFFIXES, ".jsonl", ".ndjson", ".json", ".gz", ".zst", ".bz2", ".xz"):
        assert ending in text, (ending, text)
    # The scaffold reads a .json file as JSON text, the others as JSON lines.
    assert (".json (JSON text" in text) == (module is scaffold)


def test_a_new_input_format_is_in_the_help_without_editing_it(monkeypatch):
    from transforms.inputs import registry

    monkeypatch.setattr(registry, "FORMATS", (*registry.FORMATS, registry.Registered(
        "csv", (".csv", ".csv.gz"), "transforms.inputs.csv", title="CSV")))
    for module in (bucketed, scaffold, train_bpe):
        assert "or .csv (CSV, plain or .gz) files" in " ".join(_input_help(module).split())
