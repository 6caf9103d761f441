"""Issue 33 item 6: the test double is not live in production. The sandbox provider's actions
and event inboxes exist only with ``EFFECT_LEDGER_SANDBOX`` on (quick start, tests, lab), and no
real provider's source accepts events signed with a secret published in this repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from operations.adapters.registry import UnknownAction, evidence_sources, get_adapter, known_actions
from operations.adapters.secrets import PUBLISHED_SANDBOX_EVENTS_SECRET
from reconciliation.models import ProviderEvent

BASE_DIR = Path(__file__).resolve().parents[2]
OWN_SECRET = "whsec_" + "b3duLWFjbWUtc2VjcmV0LWZvci10ZXN0cw=="


def signed(event: dict[str, Any], secret: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(event).encode()
    now = timezone.now()
    return body, {
        "webhook-id": event["id"],
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(event["id"], now, body.decode()),
    }


CHARGE_EVENT = {
    "id": "evt_forged",
    "type": "charge.succeeded",
    "data": {
        "object": "charge",
        "id": "ch_forged",
        "reference": "order-77",
        "amount": 1200,
        "currency": "EUR",
    },
}


def sandbox_served_in_a_fresh_process(
    *, without: tuple[str, ...], action: str, extra: dict[str, str] | None = None
) -> list[str]:
    """``[EFFECT_LEDGER_SANDBOX, whether action is served]`` as a new process reads its settings
    with the variables ``without`` names unset and ``extra`` set (nothing connects to a database)."""
    env = {k: v for k, v in os.environ.items() if k not in without} | (extra or {})
    script = (
        "import django; django.setup(); from django.conf import settings;"
        "from operations.adapters.registry import known_actions;"
        f"print(settings.EFFECT_LEDGER_SANDBOX, {action!r} in known_actions())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env={**env, "DJANGO_SETTINGS_MODULE": "console.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.split()


def test_a_production_configuration_serves_no_sandbox_action() -> None:
    # given: a process started as a deployment would be (a DATABASE_URL), nothing said about
    # the sandbox; when: it reads its settings; then
    served = sandbox_served_in_a_fresh_process(
        without=("EFFECT_LEDGER_SANDBOX", "DJANGO_DEBUG"),
        action="payments.charge",
        extra={"DATABASE_URL": "postgres://ledger@db.internal:5432/ledger"},
    )
    assert served == ["False", "False"]


@pytest.mark.django_db
def test_i33_6_without_the_sandbox_its_actions_and_inbox_do_not_exist(settings: Any, client: Client) -> None:
    # given
    settings.EFFECT_LEDGER_SANDBOX = False
    body, headers = signed(CHARGE_EVENT, PUBLISHED_SANDBOX_EVENTS_SECRET)

    # when
    response = client.post(
        "/providers/sandbox-payments/events", data=body, content_type="application/json", headers=headers
    )

    # then
    assert response.status_code == 404
    assert not ProviderEvent.objects.exists()
    assert "payments.charge" not in known_actions()
    assert "sandbox-payments" not in evidence_sources()
    with pytest.raises(UnknownAction):
        get_adapter("payments.charge")


@pytest.mark.django_db
def test_the_sandbox_inbox_is_there_where_the_sandbox_runs(settings: Any, client: Client) -> None:
    settings.EFFECT_LEDGER_SANDBOX = True
    body, headers = signed(CHARGE_EVENT, PUBLISHED_SANDBOX_EVENTS_SECRET)
    response = client.post(
        "/providers/sandbox-payments/events", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["events secret", "EFFECT_LEDGER_PROVIDER_EVENT_SECRETS"])
def test_a_real_source_signed_with_a_published_secret_is_refused(
    settings: Any, client: Client, where: str
) -> None:
    # given: a declared provider whose events secret is the sandbox's published one
    events: dict[str, Any] = {"source": "acme-pay", "proving_types": ["charge.succeeded"]}
    if where == "events secret":
        events["secret"] = PUBLISHED_SANDBOX_EVENTS_SECRET
    else:
        settings.EFFECT_LEDGER_PROVIDER_EVENT_SECRETS = {"acme-pay": PUBLISHED_SANDBOX_EVENTS_SECRET}
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": "https://api.acme.test/t", "events": events}
    }
    body, headers = signed(CHARGE_EVENT, PUBLISHED_SANDBOX_EVENTS_SECRET)

    # when
    response = client.post(
        "/providers/acme-pay/events", data=body, content_type="application/json", headers=headers
    )

    # then
    assert response.status_code == 401
    assert not ProviderEvent.objects.exists()
    with pytest.raises(SystemCheckError, match="operations.E004"):
        call_command("check")


@pytest.mark.django_db
def test_a_real_source_with_its_own_secret_is_accepted(settings: Any, client: Client) -> None:
    events = {"source": "acme-pay", "secret": OWN_SECRET, "proving_types": ["charge.succeeded"]}
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": "https://api.acme.test/t", "events": events}
    }
    body, headers = signed(CHARGE_EVENT, OWN_SECRET)
    response = client.post(
        "/providers/acme-pay/events", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 200
    call_command("check")  # no error


def test_check_deploy_warns_when_the_sandbox_is_on(settings: Any, capsys: Any) -> None:
    settings.EFFECT_LEDGER_SANDBOX, settings.DEBUG = True, False
    with pytest.raises(SystemCheckError, match="operations.W005"):
        call_command("check", "--deploy", "--fail-level", "WARNING")
    settings.EFFECT_LEDGER_SANDBOX = False
    with pytest.raises(SystemCheckError) as raised:  # the test settings' HTTPS warnings remain
        call_command("check", "--deploy", "--fail-level", "WARNING")
    assert "operations.W005" not in str(raised.value)


def test_check_deploy_names_a_declared_secret_that_cannot_be_read(settings: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("ACME_KEY_FOR_CHECK", raising=False)
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {
            "url": "https://api.acme.test/t",
            "auth": {"scheme": "bearer", "secret": "env:ACME_KEY_FOR_CHECK"},
        }
    }
    with pytest.raises(SystemCheckError, match=r"operations.W006.*|env:ACME_KEY_FOR_CHECK") as raised:
        call_command("check", "--deploy", "--fail-level", "WARNING")
    assert "env:ACME_KEY_FOR_CHECK" in str(raised.value)
    monkeypatch.setenv("ACME_KEY_FOR_CHECK", "sk_test_x")
    with pytest.raises(SystemCheckError) as raised:  # the test settings' HTTPS warnings remain
        call_command("check", "--deploy", "--fail-level", "WARNING")
    assert "operations.W006" not in str(raised.value) and "sk_test_x" not in str(raised.value)


def test_i34_the_quick_starts_embedded_mode_serves_the_sandbox_to_every_command() -> None:
    # given: the tutorial's second terminal: no DATABASE_URL (the quick start's embedded
    # database), nothing said about the sandbox. ``manage.py resolve`` there must serve what the
    # quick start's workers serve, or an "absent" on a sandbox email ends it FAILED as unserved.
    # when: it reads its settings (nothing connects, so no embedded PostgreSQL starts); then
    served = sandbox_served_in_a_fresh_process(
        without=("EFFECT_LEDGER_SANDBOX", "DJANGO_DEBUG", "DATABASE_URL"), action="email.send"
    )
    assert served == ["True", "True"]
