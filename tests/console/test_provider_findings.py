"""Provider findings in the console (issue 19, case C21): listed with money formatted, counted
on the dashboard and in /metrics, worked by operators (link, compensate, close; audited), with
every refusal clear, audited and changing nothing; statement runs and the CSV upload."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from operations.adapters.base import StatementEntry
from operations.models import AuditEvent, Intent, Outcome
from reconciliation.models import (
    Evidence,
    ProviderFinding,
    StatementLine,
    StatementMapping,
    StatementRun,
    StatementUpload,
)
from reconciliation.statement_uploads import statement_upload_import
from reconciliation.statements import run
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

SOURCE = "sandbox-payments"


def succeeded(reference: str, provider_reference: str, amount: int = 4990) -> Intent:
    intent = submit(arguments=charge_arguments(amount, reference=reference), reference=reference)
    Intent.objects.filter(id=intent.id).update(status=Intent.Status.SUCCEEDED)
    Outcome.objects.create(
        intent=intent, source=Outcome.Source.PROVIDER, provider_reference=provider_reference
    )
    intent.refresh_from_db()
    return intent


@pytest.fixture
def findings() -> dict[str, Any]:
    """One finding of each statement kind: extra (no intent), missing, amount mismatch."""
    omitted = succeeded("order-2", "ch_2")
    changed = succeeded("order-3", "ch_3", amount=1000)
    entries = [
        StatementEntry("ch_3", changed.idempotency_key, "order-3", 999, "EUR"),
        StatementEntry("ch_x", "direct", "nobody", 12345, "EUR"),
    ]
    run(source=SOURCE, day=timezone.now().date(), entries=entries, origin="api")
    by_kind = {f.kind: f for f in ProviderFinding.objects.all()}
    return {"omitted": omitted, "changed": changed, **by_kind}


def decide(client: Client, finding: ProviderFinding, verb: str, **data: str) -> Any:
    return client.post(
        reverse("provider-finding-resolve", args=[finding.id, verb]), data, HTTP_HX_REQUEST="true"
    )


def unattached(event: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(intent_id__isnull=True, event=event))


def test_c21_findings_are_listed_counted_on_the_dashboard_and_in_metrics(
    operator_client: Client, findings: dict[str, Any]
) -> None:
    page = operator_client.get(reverse("provider-findings")).content.decode()
    assert "Extra at the provider" in page and "Missing at the provider" in page and "Amount mismatch" in page
    assert "123.45 EUR" in page and "9.99 EUR" in page and "10.00 EUR" in page
    only_missing = operator_client.get(
        reverse("provider-findings") + "?kind=missing_at_provider"
    ).content.decode()
    assert "ch_2" in only_missing and "ch_x" not in only_missing
    dashboard = operator_client.get(reverse("dashboard")).content.decode()
    assert '<td class="num" id="open-provider-findings-extra_at_provider">1</td>' in dashboard
    assert 'id="open-provider-findings-orphan_event"' not in dashboard  # none: no row (issue 39 item 5)
    metrics = Client().get(reverse("metrics")).content.decode()
    assert 'effect_ledger_provider_findings_open{kind="missing_at_provider"} 1.0' in metrics
    assert 'effect_ledger_provider_findings_open{kind="amount_mismatch"} 1.0' in metrics


def test_c21_close_needs_a_reason_and_an_open_finding_and_is_audited(
    operator_client: Client, findings: dict[str, Any]
) -> None:
    extra = findings["extra_at_provider"]
    refused = decide(operator_client, extra, "close", reason="  ")
    assert refused.status_code == 422 and "needs a reason" in refused.content.decode()
    extra.refresh_from_db()
    assert extra.state == "open"
    assert [e.data["decision"] for e in unattached("decision_refused")] == ["provider finding close"]

    closed = decide(operator_client, extra, "close", reason="a provider fee, not an effect")
    assert closed.status_code == 200 and "Decided: close" in closed.content.decode()
    extra.refresh_from_db()
    assert (extra.state, extra.resolution, extra.resolved_by) == ("resolved", "closed", "user:otto")
    [event] = unattached("provider_finding_close")
    assert event.reason == "a provider fee, not an effect" and event.data["finding_id"] == extra.id

    again = decide(operator_client, extra, "close", reason="twice")
    assert again.status_code == 422 and "resolved, not open" in again.content.decode()
    assert len(unattached("provider_finding_close")) == 1


def test_c21_link_checks_the_intent_and_its_source(operator_client: Client, findings: dict[str, Any]) -> None:
    extra = findings["extra_at_provider"]
    unknown = decide(
        operator_client, extra, "link", reason="ours", intent_id="00000000-0000-0000-0000-000000000000"
    )
    assert (
        unknown.status_code == 422
        and "no intent 00000000-0000-0000-0000-000000000000" in unknown.content.decode()
    )
    garbage = decide(operator_client, extra, "link", reason="ours", intent_id="order-9")
    assert garbage.status_code == 422 and "is not an intent id" in garbage.content.decode()
    email = submit(action="email.send", arguments={"to": "a@example.com", "subject": "s", "body": "b"})
    other = decide(operator_client, extra, "link", reason="ours", intent_id=str(email.id))
    assert (
        other.status_code == 422
        and "is a email.send, not an intent of sandbox-payments" in other.content.decode()
    )
    extra.refresh_from_db()
    assert extra.state == "open" and extra.intent_id is None

    target = succeeded("order-x", "ch_xx", amount=12345)  # the amount the line holds
    linked = decide(
        operator_client,
        extra,
        "link",
        reason="the order's charge, reference typed wrong",
        intent_id=str(target.id),
    )
    assert linked.status_code == 200
    extra.refresh_from_db()
    assert (extra.state, extra.resolution, extra.intent_id) == ("resolved", "linked", target.id)
    assert StatementLine.objects.get(provider_reference="ch_x").intent_id == target.id
    assert (
        Evidence.objects.get(intent=target, result="finding_link").detail["reason"].startswith("the order's")
    )
    assert unattached("provider_finding_link")[0].data["intent_id"] == str(target.id)


def test_c21_compensate_opens_the_compensation_and_is_refused_for_a_missing_effect(
    operator_client: Client, findings: dict[str, Any]
) -> None:
    missing = findings["missing_at_provider"]
    page = operator_client.get(reverse("provider-finding-detail", args=[missing.id])).content.decode()
    assert "Open a compensation" not in page
    refused = decide(operator_client, missing, "compensate", reason="undo")
    assert refused.status_code == 422 and "nothing to undo" in refused.content.decode()
    assert AuditEvent.objects.filter(intent_id=missing.intent_id, event="decision_refused").count() == 1

    mismatch = findings["amount_mismatch"]
    done = decide(operator_client, mismatch, "compensate", reason="the provider charged 9.99, refund it")
    assert done.status_code == 200
    mismatch.refresh_from_db()
    assert mismatch.state == "compensating" and mismatch.compensation is not None
    assert mismatch.compensation.action == "payments.refund"
    assert mismatch.compensation.arguments["charge"] == "ch_3"
    # the refund undoes what the provider charged (9.99), not what the intent asked (10.00)
    assert (mismatch.compensation.arguments["amount"], mismatch.compensation.arguments["currency"]) == (
        999,
        "EUR",
    )
    # the mismatch is the intent's own effect: it is being compensated, then COMPENSATED
    findings["changed"].refresh_from_db()
    assert findings["changed"].status == "COMPENSATING"
    assert Evidence.objects.filter(intent=findings["changed"], result="finding_compensate").count() == 1


def test_c21_a_viewer_cannot_work_findings(viewer_client: Client, findings: dict[str, Any]) -> None:
    mismatch = findings["amount_mismatch"]
    page = viewer_client.get(reverse("provider-finding-detail", args=[mismatch.id])).content.decode()
    assert "Only operators and admins can work provider findings." in page
    refused = decide(viewer_client, mismatch, "close", reason="x")
    assert refused.status_code == 403
    mismatch.refresh_from_db()
    assert mismatch.state == "open"


def test_c21_csv_upload_in_the_console_and_a_bad_file_stores_nothing(operator_client: Client) -> None:
    mapping = {
        "source": SOURCE,
        "provider_reference": "Charge ID",
        "reference": "Order",
        "amount": "Amount",
        "currency": "Currency",
    }
    saved = operator_client.post(reverse("statement-mapping"), mapping, HTTP_HX_REQUEST="true")
    assert saved.status_code == 200 and StatementMapping.objects.get().columns["amount"] == "Amount"
    assert unattached("statement_mapping_saved")[0].data["columns"]["provider_reference"] == "Charge ID"

    bad = SimpleUploadedFile("s.csv", b"Charge ID,Order,Amount,Currency\nch_1,o,49.90,EUR\nch_2,o,lots,EUR\n")
    refused = operator_client.post(
        reverse("statement-upload"),
        {"source": SOURCE, "date": "2026-03-10", "file": bad},
        HTTP_HX_REQUEST="true",
    )
    assert refused.status_code == 422 and "line 3, column &#x27;Amount&#x27;" in refused.content.decode()
    assert not StatementRun.objects.exists() and not StatementLine.objects.exists()

    good = SimpleUploadedFile("s.csv", b"Charge ID,Order,Amount,Currency\nch_1,o,49.90,EUR\n")
    done = operator_client.post(
        reverse("statement-upload"),
        {"source": SOURCE, "date": "2026-03-10", "file": good},
        HTTP_HX_REQUEST="true",
    )
    assert (
        done.status_code == 200 and "2026-03-10: 1 lines, imported in the background" in done.content.decode()
    )
    assert StatementRun.objects.get().origin == "upload"
    # the worker's import (issue 39 item 10: the upload request does not wait for it)
    upload = StatementUpload.objects.get()
    statement_upload_import(upload_id=upload.id, message_id=upload.message_id)
    runs_page = operator_client.get(reverse("statements")).content.decode()
    assert "s.csv" in runs_page and "2026-03-10" in runs_page and "upload-done" in runs_page
    assert StatementRun.objects.get().lines == 1


def test_c21_a_viewer_cannot_upload(viewer_client: Client) -> None:
    upload = SimpleUploadedFile("s.csv", b"Charge ID\nch_1\n")
    refused = viewer_client.post(
        reverse("statement-upload"),
        {"source": SOURCE, "date": "2026-03-10", "file": upload},
        HTTP_HX_REQUEST="true",
    )
    assert refused.status_code == 403 and not StatementRun.objects.exists()


def test_c21_an_orphan_events_finding_is_listed_and_linked(operator_client: Client) -> None:
    from reconciliation.models import ProviderEvent

    target = succeeded("order-7", "ch_7")
    event = ProviderEvent.objects.create(
        source=SOURCE, event_id="evt_1", event_type="charge.succeeded", provider_reference="ch_orphan"
    )
    finding = ProviderFinding.objects.create(
        fingerprint=f"orphan:{SOURCE}:ch_orphan",
        kind=ProviderFinding.Kind.ORPHAN_EVENT,
        source=SOURCE,
        event=event,
        provider_reference="ch_orphan",
    )
    listed = operator_client.get(reverse("provider-findings") + "?kind=orphan_event").content.decode()
    assert "Event with no intent" in listed and "ch_orphan" in listed
    detail = operator_client.get(reverse("provider-finding-detail", args=[finding.id])).content.decode()
    assert "evt_1 (charge.succeeded)" in detail and "Link to an intent" in detail
    linked = decide(operator_client, finding, "link", reason="the worker's charge", intent_id=str(target.id))
    assert linked.status_code == 200
    finding.refresh_from_db()
    event.refresh_from_db()
    assert (finding.state, finding.intent_id, event.intent_id) == ("resolved", target.id, target.id)


def test_c21_an_effect_no_intent_has_is_compensated_against_a_named_intent(
    operator_client: Client, findings: dict[str, Any]
) -> None:
    extra = findings["extra_at_provider"]  # ch_x, 123.45 EUR, no intent
    page = operator_client.get(reverse("provider-finding-detail", args=[extra.id])).content.decode()
    assert "Open a compensation" in page and "Intent it is compensated against" in page
    unnamed = decide(operator_client, extra, "compensate", reason="charged outside the ledger")
    assert unnamed.status_code == 422 and "name the intent" in unnamed.content.decode()
    email = submit(action="email.send", arguments={"to": "a@example.com", "subject": "s", "body": "b"})
    other = decide(operator_client, extra, "compensate", reason="refund it", intent_id=str(email.id))
    assert other.status_code == 422 and "not an intent of sandbox-payments" in other.content.decode()
    extra.refresh_from_db()
    assert (extra.state, extra.intent_id, extra.compensation_id) == ("open", None, None)
    assert not Intent.objects.filter(action="payments.refund").exists()

    # the customer's own 49.90 EUR order: the stray charge is attributed to it, not taken for it
    target = findings["omitted"]
    done = decide(operator_client, extra, "compensate", reason="refund it", intent_id=str(target.id))
    assert done.status_code == 200
    extra.refresh_from_db()
    assert (extra.state, extra.intent_id) == ("compensating", target.id)
    refund = extra.compensation
    assert refund is not None and refund.action == "payments.refund"
    # the refund undoes what the provider holds (123.45 EUR of ch_x), not the intent's 49.90
    assert (refund.arguments["charge"], refund.arguments["amount"], refund.arguments["currency"]) == (
        "ch_x",
        12345,
        "EUR",
    )
    # an effect that is not the intent's own: its state stays, its compensation is a duplicate's
    assert refund.metadata["cause"] == "duplicate"
    target.refresh_from_db()
    assert target.status == "SUCCEEDED"
    assert Evidence.objects.filter(intent=target, result="finding_compensate").count() == 1


def test_c21_an_intents_own_effect_is_never_compensated_as_an_extra(operator_client: Client) -> None:
    # given: an extra-at-provider finding naming the very charge its intent holds
    intent = succeeded("order-own", "ch_own")
    finding = ProviderFinding.objects.create(
        fingerprint=f"extra:{SOURCE}:ch_own",
        kind=ProviderFinding.Kind.EXTRA_AT_PROVIDER,
        source=SOURCE,
        intent=intent,
        provider_reference="ch_own",
        amount=4990,
        currency="EUR",
    )
    # when
    refused = decide(operator_client, finding, "compensate", reason="refund the extra")
    # then: refused, no refund of the customer's one legitimate charge
    assert refused.status_code == 422 and "is the effect intent" in refused.content.decode()
    finding.refresh_from_db()
    assert finding.state == "open" and not Intent.objects.filter(action="payments.refund").exists()


@pytest.mark.parametrize("field", ["reason", "intent_id"])
def test_c21_a_nul_in_a_decision_is_refused_in_place(
    operator_client: Client, findings: dict[str, Any], field: str
) -> None:
    extra = findings["extra_at_provider"]
    data = {"reason": "ours", "intent_id": str(findings["omitted"].id), field: "a\x00b"}
    refused = decide(operator_client, extra, "link", **data)
    assert refused.status_code == 422 and "Null characters are not allowed." in refused.content.decode()
    extra.refresh_from_db()
    assert extra.state == "open"


def test_c21_a_nul_in_a_mapping_or_the_pages_source_is_no_500(operator_client: Client) -> None:
    saved = operator_client.post(
        reverse("statement-mapping"),
        {"source": SOURCE, "provider_reference": "Charge\x00ID"},
        HTTP_HX_REQUEST="true",
    )
    assert saved.status_code == 422 and "NUL" in saved.content.decode()
    assert not StatementMapping.objects.exists()
    page = operator_client.get(reverse("statements") + "?source=%00")
    assert page.status_code == 200


@pytest.mark.parametrize(("ended", "state"), [("SUCCEEDED", "resolved"), ("FAILED", "open")])
def test_c21_a_findings_compensation_is_followed_to_its_end(
    operator_client: Client, findings: dict[str, Any], ended: str, state: str
) -> None:
    from reconciliation.finding_follow_up import follow_up

    mismatch = findings["amount_mismatch"]
    assert (
        decide(operator_client, mismatch, "compensate", reason="refund what was charged").status_code == 200
    )
    mismatch.refresh_from_db()
    assert follow_up() == 0  # still running: nothing to do
    Intent.objects.filter(id=mismatch.compensation_id).update(status=ended, last_error="declined")
    # when: the reconciler's pass follows it up
    assert follow_up() == 1
    # then: resolved when it undid the effect; open again, saying why, when it cannot
    mismatch.refresh_from_db()
    assert mismatch.state == state
    assert str(mismatch.compensation_id) in mismatch.note
    assert follow_up() == 0


def test_c21_finding_and_event_pages_render_for_every_provider_kind(
    operator_client: Client, settings: Any
) -> None:
    """Every finding kind of an intent of every provider kind (keyed, lagging lookup, list by
    reference, generic HTTP with and without a currency), its event and the intent's page: 200,
    full page and htmx partial (a page that renders for payments and 500s for email is the
    commonest bug)."""
    from reconciliation.models import ProviderEvent
    from tests.console.test_every_kind import KINDS, serve_every_kind

    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}
    pages = []
    for n, (kind, (action, arguments)) in enumerate(KINDS.items()):
        intent = submit(action=action, arguments=arguments, reference=f"kind-{n}")
        Intent.objects.filter(id=intent.id).update(status=Intent.Status.SUCCEEDED)
        Outcome.objects.create(intent=intent, source=Outcome.Source.PROVIDER, provider_reference=f"ref-{n}")
        event = ProviderEvent.objects.create(
            source=f"source-{n}",
            event_id=f"evt-{n}",
            event_type="thing.succeeded",
            provider_reference=f"ref-{n}",
            intent=intent,
            result=ProviderEvent.Result.RECORDED,
        )
        for finding_kind in ProviderFinding.Kind.values:
            finding = ProviderFinding.objects.create(
                fingerprint=f"{finding_kind}:{kind}",
                kind=finding_kind,
                source=f"source-{n}",
                intent=intent,
                event=event,
                provider_reference=f"ref-{n}-x",
                amount=arguments.get("amount"),
                currency=arguments.get("currency", ""),
                expected_amount=arguments.get("amount"),
                expected_currency=arguments.get("currency", ""),
            )
            pages.append(reverse("provider-finding-detail", args=[finding.id]))
        pages.append(reverse("intent-detail", args=[intent.id]))
    pages += [reverse("provider-findings") + "?state=all", reverse("provider-events"), reverse("dashboard")]
    for url in pages:
        for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
            response = operator_client.get(url, **headers)
            assert response.status_code == 200, (url, headers, response.status_code)


def test_i38_an_effect_found_after_the_ending_is_shown_told_and_can_be_undone(
    operator_client: Client,
) -> None:
    from operations.models import Notification
    from operations.notifications.messages import notice_for

    # given: a charge that was sent, ended FAILED, and then appeared on the provider's statement
    intent = submit(arguments=charge_arguments(reference="order-late"), reference="order-late")
    Intent.objects.filter(id=intent.id).update(status=Intent.Status.FAILED, attempt_count=1)
    entry = StatementEntry("ch_late", intent.idempotency_key, "order-late", 4990, "EUR")
    run(source=SOURCE, day=timezone.now().date(), entries=[entry], origin="api")
    finding = ProviderFinding.objects.get(kind="effect_after_ending")
    # when / then: the finding's page says what it had ended as and what proved the effect
    page = operator_client.get(reverse("provider-finding-detail", args=[finding.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Had ended" in text and "FAILED without effect" in text and "statement of" in text
    # the intent's page shows both endings on its timeline
    detail = operator_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    assert "effect_found_late" in detail and "SUCCEEDED" in detail
    # the operators' notice links the intent's page
    notice = notice_for(Notification.objects.get(intent=intent, kind="effect_found_late"), intent)
    assert notice.headline == "Effect found after the intent ended"
    assert notice.link.endswith(reverse("intent-detail", args=[intent.id]))
    # when: the operator undoes it
    response = decide(operator_client, finding, "compensate", reason="the customer did not want it")
    # then: the intent's own effect is compensated (a refund of ch_late), not a duplicate's
    assert response.status_code == 200
    intent.refresh_from_db()
    assert intent.status == Intent.Status.COMPENSATING
    refund = Intent.objects.get(compensates=intent)
    assert refund.action == "payments.refund" and refund.arguments["charge"] == "ch_late"
