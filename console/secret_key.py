"""Where Django's ``SECRET_KEY`` comes from, and when the project refuses to start.

The key signs sessions, CSRF tokens and password-reset links: whoever knows it can forge a
console session. So a key anyone can read in this repository is never used, and the choice is
never silent:

* ``DJANGO_SECRET_KEY`` set: used when it is strong (Django's own deploy check, ``security.W009``:
  at least 50 characters, at least 5 distinct, not Django's ``django-insecure-`` prefix); an empty
  value, a key this project ever shipped as a default, or a weak key is refused with
  ``ImproperlyConfigured`` while ``DEBUG`` is off.
* unset: the key in ``<data dir>/secret_key``, created once with 64 random characters
  (``secrets``, mode 0600) by the first process that needs it. Every process sharing the data
  directory (quickstart's web server, worker and beat) reads the same key, and a restart keeps
  sessions. Several machines must share one key: set ``DJANGO_SECRET_KEY`` there.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

KEY_FILE_NAME = "secret_key"
# Keys this repository once shipped as defaults: public, so never a secret.
KNOWN_DEFAULT_KEYS = frozenset({"dev-only-insecure-key-change-me-in-production"})
MIN_LENGTH = 50  # django.core.checks.security.base.SECRET_KEY_MIN_LENGTH
MIN_UNIQUE_CHARACTERS = 5  # ... SECRET_KEY_MIN_UNIQUE_CHARACTERS


def weakness(key: str) -> str | None:
    """Why ``key`` must not sign sessions, or ``None`` when it may (the rule of Django's
    ``check --deploy``, W009, plus the keys this project shipped as defaults)."""
    if not key.strip():
        return "it is empty"
    if key in KNOWN_DEFAULT_KEYS:
        return "it is the development default published in this repository"
    if key.startswith("django-insecure-"):
        return "it is a key Django generated for development ('django-insecure-' prefix)"
    if len(key) < MIN_LENGTH or len(set(key)) < MIN_UNIQUE_CHARACTERS:
        return f"it is shorter than {MIN_LENGTH} characters or has fewer than {MIN_UNIQUE_CHARACTERS} distinct ones"
    return None


def resolve_secret_key(*, configured: str | None, data_dir: Path, debug: bool) -> str:
    """The ``SECRET_KEY`` to use.

    ``configured`` is ``DJANGO_SECRET_KEY`` (``None`` when unset). Raises
    ``ImproperlyConfigured`` naming the variable when a configured key is weak and ``debug`` is
    off, or when the key file cannot be read or created.
    """
    if configured is not None:
        reason = weakness(configured)
        if reason and not debug:
            raise ImproperlyConfigured(
                f"DJANGO_SECRET_KEY is refused: {reason}. Set it to a long random value, e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe(48))', or unset it to "
                f"use a key generated once in {data_dir / KEY_FILE_NAME}."
            )
        return configured
    return _key_from_file(data_dir / KEY_FILE_NAME)


def _key_from_file(path: Path) -> str:
    """Read the key file, creating it first when it does not exist.

    Creation is atomic: the key is written to a private temporary file and linked into place,
    which fails when another process won the race, so every process ends up reading one key
    and nobody reads a half-written file.
    """
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_urlsafe(48) + "\n")
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
            finally:
                temporary.unlink()
        key = path.read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot read or create the secret key file {path} ({exc}); set DJANGO_SECRET_KEY"
        ) from exc
    reason = weakness(key)
    if reason:
        raise ImproperlyConfigured(
            f"the secret key in {path} is refused: {reason}; delete it to make a new one"
        )
    return key
