"""`pretokenize decode`: shards back to text, with and without markers, across shard boundaries."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pipelines import cli, decode
from shards import llmc
from transforms.core.encoders import load_encoder
from transforms.core.records import BadInputError
from transforms.scaffold.encode import countdown_tokens

DOCS = [
    ["Toda", "a", "pessoa", "tem", "direito", "à", "educação", "."],
    ["Ninguém", "será", "arbitrariamente", "preso", "."],
    ["A", "família", "é", "o", "elemento", "natural", "e", "fundamental", "da", "sociedade", "."],
]


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory, gpt2_spec):
    """A val/ split of DOCS cut into shards of 9 tokens, as the job cuts them."""
    encoder = load_encoder(gpt2_spec)
    stream = np.concatenate([countdown_tokens(encoder.encode_batch(words)) for words in DOCS])
    d = tmp_path_factory.mktemp("decode") / "val"
    d.mkdir()
    for i, start in enumerate(range(0, len(stream), 9)):
        part = stream[start:start + 9]
        (d / f"shard_{i:03d}.bin").write_bytes(llmc.make_header(len(part)) + part.astype("<u2").tobytes())
    return d, stream


def run_decode(paths, gpt2_spec, docs=None, markers=False) -> tuple[list[str], str]:
    out, log = io.StringIO(), io.StringIO()
    decode.decode([str(p) for p in paths], decode.load_token_bytes(gpt2_spec), docs, markers, out, log)
    text = out.getvalue()
    return (text[:-1].split("\n\n") if text else []), log.getvalue()


def test_a_split_directory_decodes_to_the_words(split_dir, gpt2_spec):
    d, _ = split_dir
    docs, log = run_decode([d], gpt2_spec)
    assert docs == [" ".join(words) for words in DOCS] and log == ""
    docs, _ = run_decode([d], gpt2_spec, markers=True)
    assert docs[1] == "<ff_4> Ninguém <ff_3> será <ff_2> arbitrariamente <ff_1> preso <ff_0> ."
    assert run_decode([d], gpt2_spec, docs=2)[0] == [" ".join(words) for words in DOCS[:2]]
    assert run_decode([d], gpt2_spec, docs=0)[0] == []


def test_a_shard_from_the_middle_skips_a_partial_start_and_reads_on_at_its_end(split_dir, gpt2_spec):
    d, stream = split_dir
    first_doc_end = int(np.flatnonzero(stream == llmc.GPT2_EOT)[0])
    index = first_doc_end // 9  # the shard where document 0 ends and document 1 begins
    assert first_doc_end % 9 != 8, "the fixture should cut inside a document"
    docs, log = run_decode([d / f"shard_{index:03d}.bin"], gpt2_spec, docs=1)
    # The tail of document 0 is skipped; document 1 is read on into the next shard(s) beside it.
    assert docs == [" ".join(DOCS[1])]
    assert f"skipped {first_doc_end % 9 + 1} tokens at the start of" in log


def test_consecutive_shards_given_by_name_are_one_stream(split_dir, gpt2_spec):
    d, _ = split_dir
    files = sorted(d.iterdir())
    assert len(files) >= 4
    docs, log = run_decode(files, gpt2_spec)
    assert docs == [" ".join(words) for words in DOCS] and log == ""


def test_document_words_handles_malformed_documents():
    words = decode.document_words(np.array([5, 6, llmc.FF_BASE + 1, 7, llmc.FF_BASE, llmc.GPT2_EOT]))
    assert [(w.countdown, w.ids.tolist()) for w in words] == [(None, [5, 6]), (1, [7]), (0, [])]


def test_the_cli_prints_documents(split_dir, gpt2_spec, capsys, monkeypatch):
    monkeypatch.setitem(cli.JOBS, "decode", ("pipelines.decode", "decode"))
    d, _ = split_dir
    assert cli.main(["decode", str(d), "--docs", "1", "--markers", "--tokenizer", gpt2_spec]) == 0
    out = capsys.readouterr().out
    assert out == "<ff_7> Toda <ff_6> a <ff_5> pessoa <ff_4> tem <ff_3> direito <ff_2> à <ff_1> educação <ff_0> .\n"


def test_a_missing_path_is_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="no such file or directory"):
        decode.expand_paths([str(tmp_path / "nope")])
    with pytest.raises(BadInputError, match="without shard_NNN.bin"):
        decode.expand_paths([str(tmp_path)])
    with pytest.raises(ValueError, match="GPT-2 tokenizer"):
        decode.load_token_bytes("jet-nemotron")
