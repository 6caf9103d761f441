"""The audit trail and what proves it whole: the hash chain, signed checkpoints (their key,
signing and verification, the RFC 9162 Merkle tree) and each intent's request hash."""
