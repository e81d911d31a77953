"""The probe: a backend other than the reference must give its ids on every class of text, or not load.

One text per class of input where a hand-written scanner or a normalization table could disagree with
the reference. Deterministic, and small enough to cost milliseconds.

    probe(encoder, reference)  # raises BackendMismatch, one line, on the first class that differs
"""

from __future__ import annotations

import base64
import hashlib
import time

import numpy as np

from transforms.tokenizers.encoder import Encoder


def _pseudo_random_bytes(n: int, seed: bytes) -> bytes:
    out, counter = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(seed + counter.to_bytes(4, "little")).digest()
        counter += 1
    return bytes(out[:n])


def _letters_run(n: int) -> str:
    letters = "ACGTacgtQWERTYqwertyZzXx"
    return "".join(letters[b % len(letters)] for b in _pseudo_random_bytes(n, b"letters"))


PROBE: dict[str, str] = {
    "letters": _letters_run(3000) + " " + "a" * 1500 + " " + "Na" * 700,
    "base64": base64.b64encode(_pseudo_random_bytes(2400, b"base64")).decode(),
    "cjk": "日本語のトークナイザーは速い。中文分词测试，包括标点符号！한국어 문장도 있습니다。"
           "久久夜色精品国产噜噜亚洲AV中文ENGLISH ｆｕｌｌｗｉｄｔｈ　全角スペース",
    "whitespace": "a  b\tc\t\t d\r\ne \r\n\r\n f\n\n\n g\u00a0h\u3000i\u2028j\u2029k \x0b\x0c l   \n  m \r \r\r\n",
    "emoji_zwj": "family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and "
                 "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F44D\U0001F3FD\U0001F1FA\U0001F1F8 "
                 "\U0001F9D1\U0001F3FB\u200D\U0001F4BB \u2764\uFE0F\u200D\U0001F525",
    "special_text": "the model ends with <|endoftext|> and<|endoftext|><|endoftext|> then <|im_start|>user "
                    "<|im_end|> <think> </think><|fim_prefix|>",
    "digits": "1234567890 3.14159 1,000,000 0xDEADBEEF 2026-11-30 ١٢٣٤ ١٢٣ ①②③ ½ ²³ 六百 Ⅻ 𝟘𝟙𝟚",
    "non_nfc": "cafe\u0301 A\u030a \u212b \u1100\u1161\u11a8 a\u0323\u0302 a\u0302\u0323 "
               "\u0041\u0308\u0301 \u00c5\u0301 \ufe20 \U0001611e\U0001611e \U000113c2\U000113b8",
    "prose": "Don't stop: it's what WE'LL do, they'RE sure. Zürich — naïve café; Ω≈ç√∫ Икс हिन्दी "
             "def f(x):\n    return [i**2 for i in range(100)]  # https://example.com/?q=1&x=2#frag",
    "lone_surrogate": "before \ud800 between \udfff\ud83d after",
}


class BackendMismatch(RuntimeError):
    """A backend's ids differ from the reference's on the probe: it must not write a tree."""


def probe(encoder: Encoder, reference: Encoder) -> float:
    """Encode PROBE with both encoders (through the batch call the job uses); raise BackendMismatch,
    one line, on the first class that differs. Returns the seconds it took."""
    start = time.perf_counter()
    names = list(PROBE)
    texts = [PROBE[name] for name in names]
    tokens, offsets = encoder.encode_tokens(texts)
    want = reference.encode_arrays(texts)
    for i, name in enumerate(names):
        got = tokens[offsets[i]:offsets[i + 1]]
        if len(got) != len(want[i]) or not np.array_equal(got, want[i]):
            n = min(len(got), len(want[i]))
            diff = np.flatnonzero(got[:n] != want[i][:n])
            first = int(diff[0]) if len(diff) else n
            raise BackendMismatch(
                f"tokenizer backend {encoder.library} differs from {reference.library} on the probe's "
                f"{name} text at token {first} ({len(got)} vs {len(want[i])} tokens): not using it"
            )
    return time.perf_counter() - start
