"""Console accounts: the one place users are created with their roles.

Roles are the groups of ``console.permissions.ROLES``. A console account holds one or more
roles and is not a Django superuser; the Django admin site (``/admin/``) is for a separate
account created with ``django_admin=True`` (staff and superuser, which the console reads as
the ``admin`` role).
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import Group
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction

from console.permissions import ROLES
from console.signin import lockout_key

GENERATED_PASSWORD_BYTES = 15  # secrets.token_urlsafe: 20 characters, 120 bits


class AccountError(ValueError):
    """A refused account: the message says which input and why; nothing was created."""


def console_user_create(
    *, username: str, roles: list[str], password: str | None = None, django_admin: bool = False
) -> tuple[Any, str]:
    """Create a console user holding ``roles``; returns ``(user, password)``.

    ``username`` is stripped and NFKC-normalised (Django's ``normalize_username``) and must pass
    Django's ``UnicodeUsernameValidator``; it is refused when another account has the same name
    ignoring case, since sign-in locks count names case-insensitively (``console.signin``).
    ``roles`` are names from ``ROLES``, at least one. ``password`` is checked by
    ``AUTH_PASSWORD_VALIDATORS``; without one, a random 20-character password is generated
    (the caller shows it once). Raises ``AccountError``; on error nothing is stored.
    """
    name = get_user_model().normalize_username(username.strip())
    try:
        UnicodeUsernameValidator()(name)
    except ValidationError as exc:
        raise AccountError(f"username {username!r}: {' '.join(exc.messages)}") from exc
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or not roles:
        raise AccountError(
            f"roles must be one or more of {', '.join(ROLES)}; got {', '.join(roles) or 'none'}"
        )
    users = get_user_model()
    taken = [
        existing
        for existing in users.objects.filter(username__iexact=name).values_list("username", flat=True)
        if lockout_key(existing) == lockout_key(name)
    ]
    if taken:
        raise AccountError(f"an account named {taken[0]!r} already exists")
    user = users(username=name, is_staff=django_admin, is_superuser=django_admin)
    if password is None:
        password = secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)
    else:
        try:
            password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise AccountError(f"password refused: {' '.join(exc.messages)}") from exc
    user.set_password(password)
    with transaction.atomic():
        user.save()
        user.groups.set(Group.objects.filter(name__in=roles))
    return user, password
