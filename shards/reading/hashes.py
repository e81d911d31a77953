"""Stable hashes for the validation split, the window generator and the epoch permutations.

Each has its own BLAKE2b personalisation, so none correlates with another or with the hashes of
shards.layout. Integers and hashlib only: the same on every machine, Python and numpy version.
"""

from __future__ import annotations

import hashlib


def validation_key(doc_id: str) -> float:
    """Where a document falls in [0, 1) for the validation split; it is held out when this is < fraction.

    A BLAKE2b-64 of the UTF-8 id personalised ``validation``, divided by 2**64. Growing the fraction
    only moves documents from train to val, never back.
    """
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, person=b"validation").digest()
    return int.from_bytes(digest, "little") / 2.0**64


def window_uniforms(seed: int, index: int) -> tuple[float, float]:
    """The two uniforms in [0, 1) of window ``index``: the first picks the bucket, the second the start."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and window index must be >= 0, got {seed} and {index}")
    digest = hashlib.blake2b(
        index.to_bytes(8, "little"), digest_size=16, key=seed.to_bytes(8, "little"), person=b"windows"
    ).digest()
    a = int.from_bytes(digest[:8], "little") >> 11
    b = int.from_bytes(digest[8:], "little") >> 11
    return a * 2.0**-53, b * 2.0**-53


def _round_keys(seed: int, *path: object) -> tuple[int, ...]:
    """The Feistel round keys of the permutation named by ``path`` (e.g. ``("windows", "1024", 3)``)."""
    digest = hashlib.blake2b("/".join(map(str, path)).encode("utf-8"), digest_size=8 * _ROUNDS,
                             key=seed.to_bytes(8, "little"), person=b"epochs").digest()
    return tuple(int.from_bytes(digest[8 * i:8 * i + 8], "little") for i in range(_ROUNDS))


_ROUNDS = 8
_M64 = (1 << 64) - 1


class Permutation:
    """A seeded bijection of ``range(n)``, computed for one index at a time: no table, so an epoch of
    a billion windows costs no memory, and window k is found without the k before it.

    A Feistel network over the bits of ``n - 1``, split into a left and a right half (floor and ceil
    of half the bits): 8 rounds, each XORing into one half a splitmix64-style mix of the other half
    and a round key; then walked back into range (applied again until the value is below ``n``,
    at most twice on average, as ``n`` is more than half the network's range). Integers only, so the
    same on every machine, Python and numpy version. The round keys are a BLAKE2b of the seed and
    ``path``, which names the permutation.
    """

    def __init__(self, n: int, seed: int, *path: object):
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = n
        bits = max(1, (n - 1).bit_length())
        self._right_bits = bits - bits // 2
        self._masks = ((1 << (bits // 2)) - 1, (1 << self._right_bits) - 1)
        keys = _round_keys(seed, *path)
        self._key_pairs = tuple(zip(keys[0::2], keys[1::2], strict=True))

    def __len__(self) -> int:
        return self.n

    def _network(self, x: int) -> int:
        shift = self._right_bits
        mask_left, mask_right = self._masks
        left, right = x >> shift, x & mask_right
        for key_left, key_right in self._key_pairs:
            z = ((right ^ key_left) * 0x9E3779B97F4A7C15) & _M64
            z ^= z >> 29
            z = (z * 0xBF58476D1CE4E5B9) & _M64
            left ^= (z ^ (z >> 32)) & mask_left
            z = ((left ^ key_right) * 0x9E3779B97F4A7C15) & _M64
            z ^= z >> 29
            z = (z * 0xBF58476D1CE4E5B9) & _M64
            right ^= (z ^ (z >> 32)) & mask_right
        return (left << shift) | right

    def __call__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} is outside 0..{self.n - 1}")
        x = self._network(index)
        while x >= self.n:
            x = self._network(x)
        return x
