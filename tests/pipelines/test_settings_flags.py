"""A job's flags are generated from its settings dataclass: one place for defaults, types and help."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import SAMPLE_PARQUET

from pipelines import bucketed, cli, scaffold, train_bpe
from transforms.bpe.settings import TrainBpeSettings
from transforms.bucketed.filter import LidFilterConfig
from transforms.bucketed.settings import DOCUMENT_FILTER, BucketedSettings
from transforms.core.settings import CHOICES, HELP, flag_fields, setting
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
        assert action.default == field.default and action.help == field.metadata[HELP]
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
    """The bucketed and train-bpe jobs and the filter's own config have the same FinePDFs defaults."""
    for name, (default, _) in DOCUMENT_FILTER.items():
        assert BucketedSettings.__dataclass_fields__[name].default == default
        assert TrainBpeSettings.__dataclass_fields__[name].default == default
    lid = LidFilterConfig()
    assert (lid.language, lid.threshold) == (DOCUMENT_FILTER["language"][0], DOCUMENT_FILTER["lid_threshold"][0])
    assert ",".join(lid.language_fields) == DOCUMENT_FILTER["language_fields"][0]
    assert lid.score_field == DOCUMENT_FILTER["lid_score_field"][0]


def test_a_new_setting_is_a_new_flag(capsys):
    """What a new setting costs: its field. The flag, its default and help follow."""
    from pipelines import flags

    @dataclasses.dataclass(frozen=True)
    class Settings:
        input: str
        output: str
        shuffle_window: int = setting(8, "documents held to shuffle")
        fast: bool = setting(False, "go fast")

    p = flags.job_parser("toy", "a toy job", "files")
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
