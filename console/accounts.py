"""Console accounts: the one place users are created with their roles.

Roles are the groups of ``console.permissions.ROLES``. A console account holds one or more
roles, each on the tenants it is created for or on every tenant (``RoleGrant``, issue 18 item
5), and is not a Django superuser; the Django admin site (``/admin/``) is for a separate
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
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from console.permissions import ROLES
from console.signin import lockout_key
from operations.access.tenants import role_grants_set

GENERATED_PASSWORD_BYTES = 15  # secrets.token_urlsafe: 20 characters, 120 bits
MAX_PASSWORD_LENGTH = 1024  # far above any passphrase, far below the 64 KiB request limit


class AccountError(ValueError):
    """A refused account: the message says which input and why; nothing was created."""


def username_taken(name: str, *, exclude_pk: Any = None) -> str | None:
    """Why ``name`` cannot be a new account's name, or None: another account has the same name
    case-folded (``console.signin.lockout_key``). Two such accounts would share one sign-in lock,
    and signing in to one would clear the other's. Python's case folding is not the database's
    ``UPPER`` (``straße`` / ``STRASSE``), so every name is compared. Used by ``create_user`` and
    the admin's user forms alike."""
    users = get_user_model()
    key = lockout_key(name)
    others = users.objects.exclude(pk=exclude_pk) if exclude_pk is not None else users.objects.all()
    for existing in others.values_list(users.USERNAME_FIELD, flat=True).iterator():
        if lockout_key(existing) == key:
            return f"an account named {existing!r} already exists (names are compared ignoring case)"
    return None


def console_user_create(
    *,
    username: str,
    roles: list[str],
    tenants: list[str] | None = None,
    all_tenants: bool = False,
    password: str | None = None,
    django_admin: bool = False,
    email: str = "",
) -> tuple[Any, str]:
    """Create a console user holding ``roles`` on ``tenants`` (or on every tenant with
    ``all_tenants``: exactly one of the two); returns ``(user, password)``.

    ``username`` is stripped and NFKC-normalised (Django's ``normalize_username``) and must pass
    Django's ``UnicodeUsernameValidator`` and the field's length; it is refused when another
    account has the same name case-folded, since sign-in locks count names that way
    (``console.signin``).
    ``roles`` are names from ``ROLES``, at least one (repeats ignored). ``tenants`` are tenant
    names (1 to 100 characters, not ``*``; repeats ignored); a ``django_admin`` account is a
    superuser, which holds every tenant, so it takes ``all_tenants``. ``password`` must be one
    the login form can send (no NUL, at most ``MAX_PASSWORD_LENGTH`` characters) and pass
    ``AUTH_PASSWORD_VALIDATORS``; without one, a random 20-character password is generated
    (the caller shows it once). ``email`` (stripped; empty for none) must pass Django's
    ``validate_email``: it is where the account's notices go (docs/reference/console.md, "Notifications to approvers and operators"); an
    account without one is told nothing. Raises ``AccountError``; on error nothing is stored.
    """
    users = get_user_model()
    name = users.normalize_username(username.strip())
    max_length = getattr(users._meta.get_field(users.USERNAME_FIELD), "max_length", None) or 150
    if len(name) > max_length:
        raise AccountError(f"username is {len(name)} characters; at most {max_length}")
    try:
        UnicodeUsernameValidator()(name)
    except ValidationError as exc:
        raise AccountError(f"username {username!r}: {' '.join(exc.messages)}") from exc
    roles = list(dict.fromkeys(roles))
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or not roles:
        raise AccountError(
            f"roles must be one or more of {', '.join(ROLES)}; got {', '.join(roles) or 'none'}"
        )
    if django_admin and "admin" not in roles:
        # A superuser is the admin role to the console: asking for less would be a lie.
        raise AccountError(
            "--django-admin makes a superuser, whom the console treats as admin: add --role admin"
        )
    tenants = list(dict.fromkeys(t.strip() for t in tenants or []))
    if all_tenants == bool(tenants):
        raise AccountError(
            "name the tenants (--tenant T, repeatable) or grant every tenant (--all-tenants), not both"
        )
    if django_admin and not all_tenants:
        raise AccountError("a Django admin account is a superuser and holds every tenant: use --all-tenants")
    for tenant in tenants:
        if not tenant or tenant == "*" or len(tenant) > 100:
            raise AccountError(f"tenant {tenant!r}: a tenant name is 1 to 100 characters and not '*'")
    email = email.strip()
    if email:
        try:
            validate_email(email)
        except ValidationError as exc:
            raise AccountError(f"email {email!r} is not an email address") from exc
    problem = username_taken(name)
    if problem:
        raise AccountError(problem)
    user = users(username=name, email=email, is_staff=django_admin, is_superuser=django_admin)
    if password is None:
        password = secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)
    else:
        if "\x00" in password or len(password) > MAX_PASSWORD_LENGTH:
            raise AccountError(
                f"password refused: it must have no NUL character and at most {MAX_PASSWORD_LENGTH} "
                "characters (the login form could never send it)"
            )
        try:
            password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise AccountError(f"password refused: {' '.join(exc.messages)}") from exc
    user.set_password(password)
    try:
        with transaction.atomic():
            user.save()
            user.groups.set([Group.objects.get_or_create(name=role)[0] for role in roles])
            role_grants_set(user=user, roles=roles, tenants=None if all_tenants else tenants)
    except IntegrityError as exc:  # created by someone else since the check above
        raise AccountError(f"an account named {name!r} already exists") from exc
    return user, password
