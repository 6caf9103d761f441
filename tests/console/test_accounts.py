"""Issue 12, item 8: a documented way to create console users with roles."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from console.permissions import roles_of

pytestmark = pytest.mark.django_db


def _create(*args: str, stdin: str | None = None, monkeypatch: Any = None) -> str:
    """``create_user`` with ``args``, on every tenant unless ``args`` say where."""
    if "--tenant" not in args and "--all-tenants" not in args:
        args = (*args, "--all-tenants")
    out = io.StringIO()
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    call_command("create_user", *args, stdout=out)
    return out.getvalue()


def _password(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("password: "))
    return line.split()[1]


@pytest.mark.parametrize("role", ["viewer", "approver", "operator", "admin"])
def test_i12_8_create_user_prints_a_password_that_signs_in_with_the_role(role: str) -> None:
    # when
    output = _create("ann", "--role", role)
    # then: the printed password signs in, and the account holds exactly that role
    user = get_user_model().objects.get(username="ann")
    assert roles_of(user) == [role]
    assert not user.is_superuser and not user.is_staff
    client = Client()
    response = client.post(reverse("login"), {"username": "ann", "password": _password(output)})
    assert response.status_code == 302
    assert client.get(reverse("dashboard")).status_code == 200


def test_i12_8_several_roles_and_a_password_from_stdin(monkeypatch: Any) -> None:
    output = _create(
        "bea",
        "--role",
        "operator",
        "--role",
        "approver",
        "--password-stdin",
        stdin="a long enough passphrase\n",
        monkeypatch=monkeypatch,
    )
    user = get_user_model().objects.get(username="bea")
    assert roles_of(user) == ["operator", "approver"]
    assert user.check_password("a long enough passphrase")
    assert "password:" not in output  # a password the caller gave is never echoed


def test_i12_8_django_admin_account_reaches_the_admin_site() -> None:
    output = _create("root", "--role", "admin", "--django-admin")
    client = Client()
    client.post(reverse("admin:login"), {"username": "root", "password": _password(output)})
    assert client.get(reverse("admin:index")).status_code == 200


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["cy"], None, "roles must be one or more"),
        (["bad name!", "--role", "viewer"], None, "username"),
        (["  ", "--role", "viewer"], None, "username"),
        (["Existing", "--role", "viewer"], None, "already exists"),
        (["ｅｘｉｓｔｉｎｇ", "--role", "viewer"], None, "already exists"),
        (["dan", "--role", "viewer", "--password-stdin"], "short\n", "password refused"),
        (["dan", "--role", "viewer", "--password-stdin"], "password123\n", "password refused"),
        (["dan", "--role", "viewer", "--password-stdin"], "\n", "empty line"),
        (["straße", "--role", "viewer"], None, "already exists"),
        (["a" * 151, "--role", "viewer"], None, "at most 150"),
        (["dan", "--role", "viewer", "--password-stdin"], "abc\x00defghijk\n", "NUL"),
        (["dan", "--role", "viewer", "--password-stdin"], "p" * 1025 + "\n", "at most 1024"),
        (["dv", "--role", "viewer", "--django-admin"], None, "add --role admin"),
    ],
    ids=[
        "no-role",
        "bad-characters",
        "blank",
        "same-name-other-case",
        "fullwidth-twin",
        "too-short",
        "common",
        "empty-stdin",
        "case-folds-to-an-existing-name",
        "too-long-name",
        "nul-in-password",
        "password-too-long",
        "django-admin-needs-admin-role",
    ],
)
def test_i12_8_create_user_refuses_bad_input_and_creates_nothing(
    args: list[str], stdin: str | None, message: str, monkeypatch: Any
) -> None:
    # given
    get_user_model().objects.create_user("existing", password="x" * 20)
    get_user_model().objects.create_user("strasse", password="x" * 20)
    before = get_user_model().objects.count()
    # when / then
    with pytest.raises(CommandError, match=message):
        _create(*args, stdin=stdin, monkeypatch=monkeypatch)
    assert get_user_model().objects.count() == before


def test_i12_8_an_unknown_role_is_refused_by_the_command_line() -> None:
    with pytest.raises(CommandError, match="invalid choice"):
        _create("eve", "--role", "superuser")
    assert not get_user_model().objects.filter(username="eve").exists()


def test_i12_8_quickstart_console_account_is_operator_and_approver_not_superuser() -> None:
    # when: quickstart's set-up step (no processes)
    out = io.StringIO()
    call_command("quickstart", "--no-run", stdout=out)
    # then
    users = get_user_model().objects
    operator, admin = users.get(username="operator"), users.get(username="admin")
    assert roles_of(operator) == ["operator", "approver"] and not operator.is_superuser
    assert admin.is_superuser and admin.is_staff
    assert "console account: operator / " in out.getvalue()
    assert "Django admin account (/admin/): admin / " in out.getvalue()
    # a second run keeps both and prints no password
    again = io.StringIO()
    call_command("quickstart", "--no-run", stdout=again)
    assert "shown once" not in again.getvalue().split("demo agent")[0]


def test_i12_8_a_repeated_role_is_one_role() -> None:
    output = _create("fay", "--role", "viewer", "--role", "viewer")
    assert "role(s) viewer on every tenant\n" in output
    assert roles_of(get_user_model().objects.get(username="fay")) == ["viewer"]


def test_i12_8_the_admin_add_user_form_refuses_a_name_that_folds_to_another(client: Any) -> None:
    # given: an existing account and a Django admin signed in
    get_user_model().objects.create_user("Straße", password="x" * 20)
    root = get_user_model().objects.create_superuser("root", password="y" * 20)
    client.force_login(root)
    # when: the admin adds "strasse" (the same sign-in lock)
    response = client.post(
        reverse("admin:auth_user_add"),
        {"username": "strasse", "password1": "a long passphrase", "password2": "a long passphrase",
         "usable_password": "true"},
    )  # fmt: skip
    # then: refused with the reason, nothing created
    assert response.status_code == 200 and b"already exists" in response.content
    assert not get_user_model().objects.filter(username="strasse").exists()


def test_i18_5_create_user_must_say_on_which_tenants() -> None:
    # when / then: neither flag is refused, and nothing is created
    with pytest.raises(CommandError, match="--tenant --all-tenants is required"):
        call_command("create_user", "gil", "--role", "viewer", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username="gil").exists()


def test_i18_5_create_user_grants_its_roles_on_the_named_tenants_only() -> None:
    # given
    from operations.access.tenants import console_scope, may_act

    # when
    output = _create(
        "hal", "--role", "approver", "--tenant", "acme", "--tenant", "globex", "--tenant", "acme"
    )
    # then
    user = get_user_model().objects.get(username="hal")
    assert "role(s) approver on acme, globex" in output
    assert console_scope(user).names == {"acme", "globex"} and not console_scope(user).every
    assert may_act(user, ["approver"], "acme") and not may_act(user, ["approver"], "initech")


@pytest.mark.parametrize(
    "args",
    [
        ["--tenant", "*"],
        ["--tenant", ""],
        ["--tenant", "x" * 101],
        ["--tenant", "acme", "--all-tenants"],
        ["--tenant", "acme", "--django-admin"],
    ],
    ids=["star", "blank", "too-long", "both", "superuser-on-one-tenant"],
)
def test_i18_5_create_user_refuses_a_bad_tenant_and_creates_nothing(args: list[str]) -> None:
    with pytest.raises(CommandError):
        _create("ida", "--role", "viewer", *args)
    assert not get_user_model().objects.filter(username="ida").exists()


def test_i18_5_quickstart_accounts_hold_every_tenant() -> None:
    from operations.access.tenants import console_scope, roles_on_every_tenant

    call_command("quickstart", "--no-run", stdout=io.StringIO())
    operator = get_user_model().objects.get(username="operator")
    assert console_scope(operator).every
    assert roles_on_every_tenant(operator) == ["operator", "approver"]


def test_i18_5_the_upgrade_grants_existing_role_members_every_tenant_and_nothing_more() -> None:
    # given: accounts made before tenant grants existed: group members without a grant, and one
    # without any group
    import importlib

    from django.apps import apps
    from django.contrib.auth.models import Group

    from operations.access.tenants import console_scope, may_act
    from operations.models import RoleGrant

    users = get_user_model().objects
    old = users.create_user("old-approver", password="x" * 20)
    old.groups.add(Group.objects.get_or_create(name="approver")[0])
    nobody = users.create_user("no-role", password="x" * 20)
    assert console_scope(old).empty  # a membership alone is the role on no tenant (fail closed)
    migration = importlib.import_module("operations.migrations.0022_tenant_role_grants")
    # when
    migration.grant_every_tenant_to_existing_members(apps, None)
    # then: what the membership meant before the upgrade, no more
    assert console_scope(old).every and may_act(old, ["approver"], "any-tenant")
    assert not may_act(old, ["operator"], "any-tenant")
    assert not RoleGrant.objects.filter(user=nobody).exists()


def test_create_user_email_gives_the_account_an_address_notices_reach() -> None:
    # when
    output = _create("ann", "--role", "approver", "--email", " ann@example.test ")
    # then
    assert "user ann with role(s) approver on every tenant" in output
    assert get_user_model().objects.get(username="ann").email == "ann@example.test"


def test_create_user_refuses_an_email_that_is_not_an_address_and_creates_nothing() -> None:
    with pytest.raises(CommandError, match="email 'ann-at-example' is not an email address"):
        _create("ann", "--role", "approver", "--email", "ann-at-example")
    assert not get_user_model().objects.filter(username="ann").exists()


def test_quickstarts_operator_receives_the_first_gated_charges_approval_notice(settings: Any) -> None:
    from django.core import mail

    from operations.models import Notification
    from operations.services.notifications import notifications_send
    from tests.factories import charge_arguments, submit

    # given: quickstart's accounts; a charge above the threshold by the demo agent
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    call_command("quickstart", "--no-run", stdout=io.StringIO())
    assert get_user_model().objects.get(username="operator").email == "operator@localhost"
    # (an operator an earlier quickstart made without an address gets it on the next run)
    get_user_model().objects.filter(username="operator").update(email="")
    again = io.StringIO()
    call_command("quickstart", "--no-run", stdout=again)
    assert "its notices now go to operator@localhost" in again.getvalue()
    intent = submit(tenant="demo", principal="agent:demo-agent", arguments=charge_arguments(25_000))
    # when
    notifications_send()
    # then: the operator (an approver on every tenant) is told, with the link
    assert Notification.objects.get(intent=intent).outcome == "delivering"
    (message,) = mail.outbox
    assert message.to == ["operator@localhost"] and f"/approvals/{intent.id}/" in message.body
