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

import hashlib
from collections.abc import Iterable

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
