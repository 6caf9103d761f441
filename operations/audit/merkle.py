"""The Merkle Tree Hash of RFC 9162 §2.1.1 (Certificate Transparency 2.0), with SHA-256.

For an ordered list of n inputs D[n]:

- MTH({}) = SHA-256() (the hash of the empty string);
- MTH({d(0)}) = SHA-256(0x00 || d(0)) (a leaf);
- MTH(D[n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n])) for n > 1, where k is the largest
  power of two smaller than n (an interior node).

The 0x00 / 0x01 prefixes keep a leaf from passing for a node (second-preimage resistance).
``MerkleRoot`` computes the same value in one pass with O(log n) memory: it keeps the roots of
the complete subtrees seen so far (sizes strictly decreasing, one per set bit of n), merging two
of equal size as soon as they appear, and at the end folds them from the right, which is the
recursion above unrolled.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data): the hash of one leaf (32 bytes)."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): an interior node (32 bytes)."""
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


class MerkleRoot:
    """Accumulates leaves in order; ``hexdigest()`` is the RFC 9162 MTH of those seen so far."""

    def __init__(self) -> None:
        self.size = 0
        # (subtree size, subtree root) pairs, sizes strictly decreasing powers of two.
        self._stack: list[tuple[int, bytes]] = []

    def add(self, data: bytes) -> None:
        """Append one leaf's input ``data`` (hashed here with the leaf prefix)."""
        size, digest = 1, leaf_hash(data)
        while self._stack and self._stack[-1][0] == size:
            left_size, left = self._stack.pop()
            size, digest = left_size + size, node_hash(left, digest)
        self._stack.append((size, digest))
        self.size += 1

    def digest(self) -> bytes:
        """The tree hash of the leaves added so far (32 bytes)."""
        if not self._stack:
            return hashlib.sha256(b"").digest()
        digest = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            digest = node_hash(left, digest)
        return digest

    def hexdigest(self) -> str:
        """The tree hash as 64 lowercase hex digits."""
        return self.digest().hex()


def merkle_root(leaves: Iterable[bytes]) -> str:
    """The RFC 9162 Merkle Tree Hash of ``leaves`` (inputs, in order), as 64 hex digits."""
    tree = MerkleRoot()
    for data in leaves:
        tree.add(data)
    return tree.hexdigest()


def _largest_power_of_two_below(n: int) -> int:
    """k of RFC 9162 §2.1.1: the largest power of two smaller than ``n`` (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def inclusion_proofs(leaves: Sequence[bytes], indexes: Iterable[int]) -> dict[int, list[bytes]]:
    """RFC 9162 §2.1.3.1 inclusion proofs (audit paths) of the leaves at ``indexes`` in the tree
    of ``leaves`` (inputs, in order): ``{index: [sibling hash, ...]}``, nearest the leaf first.

    One pass over the tree, computing each node once, however many paths are asked for.

    Raises:
        ValueError: an index outside ``0 <= index < len(leaves)``.
    """
    wanted = sorted(set(indexes))
    if wanted and not (wanted[0] >= 0 and wanted[-1] < len(leaves)):
        raise ValueError(f"a leaf index must be within 0..{len(leaves) - 1}")
    paths: dict[int, list[bytes]] = {index: [] for index in wanted}

    def subtree(lo: int, hi: int, inside: list[int]) -> bytes:
        if hi - lo == 1:
            return leaf_hash(leaves[lo])
        mid = lo + _largest_power_of_two_below(hi - lo)
        split = bisect.bisect_left(inside, mid)
        left_wanted, right_wanted = inside[:split], inside[split:]
        left, right = subtree(lo, mid, left_wanted), subtree(mid, hi, right_wanted)
        for index in left_wanted:
            paths[index].append(right)
        for index in right_wanted:
            paths[index].append(left)
        return node_hash(left, right)

    if leaves:
        subtree(0, len(leaves), wanted)
    return paths


def inclusion_verify(leaf: bytes, index: int, size: int, path: Sequence[bytes], root: bytes) -> bool:
    """Whether ``path`` proves that the leaf input ``leaf`` is at ``index`` of a tree of ``size``
    leaves whose hash is ``root`` (RFC 9162 §2.1.3.2)."""
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    digest = leaf_hash(leaf)
    for sibling in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            digest = node_hash(sibling, digest)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            digest = node_hash(digest, sibling)
        fn >>= 1
        sn >>= 1
    return sn == 0 and digest == root
