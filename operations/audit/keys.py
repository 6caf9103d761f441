"""The Ed25519 key that signs audit checkpoints, kept in a file and never in the database.

Settings (``settings.EFFECT_LEDGER``):

- ``AUDIT_SIGNING_KEY_FILE``: the private key, PEM (PKCS#8, unencrypted), default
  ``<DATA_DIR>/audit-signing-key.pem``.
- ``AUDIT_SIGNING_KEY_CREATE``: create that file on first use when it is missing (mode 0600).
  On by default only in embedded mode (no ``DATABASE_URL``), which is what quickstart runs; a
  production deployment provisions its key and keeps a copy of the public key elsewhere.
- ``AUDIT_PUBLIC_KEY_FILE``: a public key (PEM, SubjectPublicKeyInfo) to verify with instead of
  the one derived from the private key, so an auditor can verify without being able to sign.

Ed25519 is RFC 8032 (``cryptography``'s ``Ed25519PrivateKey``); a key is named by its *key id*,
the lowercase hex sha256 of its 32 raw public-key bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings


class AuditKeyError(Exception):
    """The checkpoint key is missing, unreadable or not an Ed25519 key (the message says which
    file and which setting to change)."""


def signing_key_path() -> Path:
    """The private key's file (``AUDIT_SIGNING_KEY_FILE``)."""
    return Path(settings.EFFECT_LEDGER["AUDIT_SIGNING_KEY_FILE"])


def public_key_path() -> Path | None:
    """The auditor's public key file (``AUDIT_PUBLIC_KEY_FILE``), or None to derive it."""
    configured = settings.EFFECT_LEDGER.get("AUDIT_PUBLIC_KEY_FILE") or ""
    return Path(configured) if configured else None


def signing_key_create(path: Path) -> bool:
    """Write a new Ed25519 private key to ``path`` (PEM, PKCS#8, mode 0600) unless it exists.

    Returns True when this call created the file. ``O_EXCL`` makes two processes starting
    together keep one key (the loser reads the winner's).

    Raises:
        AuditKeyError: the directory cannot be created or written.
    """
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        raise AuditKeyError(f"cannot create the audit signing key {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(pem)
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.unlink()
        raise AuditKeyError(f"cannot write the audit signing key {path}: {exc.strerror}") from exc
    return True


def signing_key_load(*, create: bool | None = None) -> Ed25519PrivateKey:
    """Read the private key from ``AUDIT_SIGNING_KEY_FILE``.

    Args:
        create: create the file when missing; None follows ``AUDIT_SIGNING_KEY_CREATE``.

    Raises:
        AuditKeyError: the file is missing (and may not be created), unreadable, or holds
            anything but an unencrypted Ed25519 private key.
    """
    path = signing_key_path()
    if create is None:
        create = bool(settings.EFFECT_LEDGER.get("AUDIT_SIGNING_KEY_CREATE"))
    if create and not path.exists():
        signing_key_create(path)
    try:
        pem = path.read_bytes()
    except FileNotFoundError as exc:
        raise AuditKeyError(
            f"no audit signing key at {path}: set EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE to an Ed25519 "
            "private key (PEM), or EFFECT_LEDGER_AUDIT_SIGNING_KEY_CREATE=1 to create one there"
        ) from exc
    except OSError as exc:
        raise AuditKeyError(f"cannot read the audit signing key {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise AuditKeyError(f"{path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditKeyError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def public_key_load() -> Ed25519PublicKey:
    """The key checkpoints are verified with: ``AUDIT_PUBLIC_KEY_FILE`` when set, else the
    public half of the private key (which is never created here: verifying needs no new key).

    Raises:
        AuditKeyError: the file is missing, unreadable or not an Ed25519 key.
    """
    path = public_key_path()
    if path is None:
        return signing_key_load(create=False).public_key()
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise AuditKeyError(
            f"cannot read the audit public key {path} (EFFECT_LEDGER_AUDIT_PUBLIC_KEY_FILE): {exc.strerror}"
        ) from exc
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise AuditKeyError(f"{path} is not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise AuditKeyError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    """The key's id: lowercase hex sha256 of its 32 raw bytes (RFC 8032 encoding)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    """The public key as PEM text (SubjectPublicKeyInfo), to hand to an auditor."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def signature_valid(public_key: Ed25519PublicKey, signature_hex: str, message: bytes) -> bool:
    """Whether ``signature_hex`` (128 hex digits) is ``public_key``'s Ed25519 signature of
    ``message``; a malformed signature is simply invalid."""
    try:
        public_key.verify(bytes.fromhex(signature_hex), message)
    except (InvalidSignature, ValueError):
        return False
    return True
