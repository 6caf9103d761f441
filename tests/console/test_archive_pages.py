"""Archived intents in the console (issue 36): the intents search and ``/intents/<id>/`` say
which archive file holds an archived intent, its read-only page reads it back from that file
(every action kind; a missing or damaged file named, never a 500), tenant scoping as for live
intents, and the dashboard's live and archive sizes. Intents are built through the services and
archived by ``archive_run``; the archive lives in a temporary directory."""

from __future__ import annotations

import gzip
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from operations.archive.services import archive_run
from operations.models import ArchivedIntent, ArchiveSegment, Intent
from operations.services import intent_cancel
from tests.console.conftest import signed_in
from tests.console.test_every_kind import KINDS, build, serve_every_kind
from tests.factories import UserFactory, charge_arguments, submit

# Transactional, as the archiver's tests: its own transactions (REPEATABLE READ snapshot, delete
# batches) commit as in production.
pytestmark = pytest.mark.django_db(transaction=True)

S = Intent.Status


@pytest.fixture(autouse=True)
def archive_dir(settings: Any, tmp_path: Path) -> Path:
    """The archive and a signing key (created on first use) under ``tmp_path``; every kind's
    action served, none gated unless a case asks (``build``)."""
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "ARCHIVE_DIR": str(tmp_path / "archive"),
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "keys" / "audit.pem"),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(tmp_path / "checkpoints.jsonl"),
    }
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}
    return tmp_path / "archive"


def archived(*intents: Intent) -> ArchiveSegment:
    """Archive ``intents`` (made to look settled 100 days ago, past the default 90 days'
    retention) and return the one segment that holds them."""
    Intent.objects.filter(id__in=[intent.id for intent in intents]).update(
        updated_at=timezone.now() - timedelta(days=100)
    )
    report = archive_run(before=timezone.now())
    assert report.intents_archived == len(intents)
    assert not Intent.objects.filter(id__in=[intent.id for intent in intents]).exists()
    (segment,) = ArchiveSegment.objects.filter(archived_intents__intent_id=intents[0].id)
    return segment


def body(client: Client, url: str, status: int = 200, **params: str) -> str:
    response = client.get(url, params)
    assert response.status_code == status, (url, response.status_code)
    return response.content.decode()


@pytest.fixture
def every_tenant_viewer() -> Client:
    return signed_in(UserFactory(username="vera", groups=["viewer"]))


@pytest.fixture
def acme_viewer() -> Client:
    return signed_in(UserFactory(username="ann", groups=["viewer"], tenants=["acme"]))


@pytest.mark.parametrize("by", ["id", "reference", "key"])
def test_i36_the_intents_search_finds_an_archived_intent_and_names_its_file(
    by: str, settings: Any, every_tenant_viewer: Client
) -> None:
    # given: a charge archived, submitted under a reference and an Idempotency-Key
    intent = build("payments.charge", S.SUCCEEDED, settings=settings, approver=None)
    segment = archived(intent)
    text = {"id": str(intent.id), "reference": intent.reference, "key": intent.client_key}[by]
    # when
    page = body(every_tenant_viewer, reverse("intents"), q=text)
    # then: no live intent, one archived, with its file and segment and a link to read it
    assert "No live intent matches." in page
    assert "1 archived intent matches" in page
    assert f"in <code>{segment.file_name}</code> (segment {segment.number})" in page
    assert reverse("archived-intent", args=[intent.id]) in page
    assert f"archived on {segment.created_at:%Y-%m-%d}" in page
    # and the htmx search (the results fragment) says the same
    fragment = every_tenant_viewer.get(
        reverse("intents"), {"q": text}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "<html" not in fragment and segment.file_name in fragment


def test_i36_the_intent_page_of_an_archived_intent_says_which_file_holds_it(
    settings: Any, every_tenant_viewer: Client
) -> None:
    # given
    intent = build("email.send", S.SUCCEEDED, settings=settings, approver=None)
    segment = archived(intent)
    # when: an old link to its live page
    page = body(every_tenant_viewer, reverse("intent-detail", args=[intent.id]))
    # then
    assert 'id="archived-notice"' in page and str(intent.id) in page
    assert f"in <code>{segment.file_name}</code> (segment {segment.number})" in page
    assert reverse("archived-intent", args=[intent.id]) in page


#: (kind, state) -> what the archived page must show besides the intent's id.
KIND_CASES = {
    ("payments.charge", S.SUCCEEDED): ["49.90 EUR", "cus_42", "outcome from provider: prov-1"],
    ("payments.charge", S.FAILED): ["49.90 EUR", "declined by the provider"],
    ("payments.charge", S.REJECTED): ["rejected by alice", "operations_approval</code>: 1 row"],
    ("email.send", S.SUCCEEDED): ["ana@example.test", "outcome from provider: prov-1"],
    ("reservations.create", S.SUCCEEDED): ["room-101", "prov-1"],
    ("reservations.cancel", S.SUCCEEDED): ["res_1", "prov-1"],
    ("generic-with-lookup", S.SUCCEEDED): ["acme.transfer", "12.50 USD", "acc_9"],
}


@pytest.mark.parametrize(("kind", "state"), list(KIND_CASES))
def test_i36_the_archived_intent_page_reads_every_kind_from_its_file(
    kind: str, state: str, settings: Any, approver: Any, every_tenant_viewer: Client
) -> None:
    # given
    intent = build(kind, state, settings=settings, approver=approver)
    events = list(intent.audit_events.order_by("seq").values_list("event", "hash"))
    attempts = intent.attempts.count()
    segment = archived(intent)
    # when
    page = body(every_tenant_viewer, reverse("archived-intent", args=[intent.id]))
    # then: the intent, its status, its file and manifest, its whole chain (verified), its rows
    assert str(intent.id) in page and intent.action in page
    assert f'class="status status-{state.lower()}">{state}</strong>' in page
    assert segment.file_name in page and segment.file_sha256 in page
    assert segment.file_name.replace(".jsonl.gz", ".manifest.json") in page
    assert f"Archive segment {segment.number}" in page
    assert 'id="chain-verifies"' in page and 'id="chain-problems"' not in page
    assert f"Audit chain ({len(events)} event" in page
    assert all(event_hash[:12] in page for _, event_hash in events)
    assert all(f"<strong>{name}" in page for name, _ in events)  # the timeline names every event
    assert ('<p class="empty">No attempt.</p>' in page) == (attempts == 0)
    for shown in KIND_CASES[(kind, state)]:
        assert shown in page, shown
    # and it is read-only: no form but the header's sign-out
    assert page.count("<form") == 1 and 'action="/logout/"' in page


def test_i36_a_missing_or_damaged_archive_file_is_named_on_the_page(
    settings: Any, archive_dir: Path, every_tenant_viewer: Client
) -> None:
    # given: an archived charge whose file is then damaged, then removed
    intent = build("payments.charge", S.SUCCEEDED, settings=settings, approver=None)
    segment = archived(intent)
    path = archive_dir / segment.file_name
    url = reverse("archived-intent", args=[intent.id])
    path.write_bytes(b"not gzip at all")
    # when
    damaged = body(every_tenant_viewer, url)
    path.unlink()
    missing = body(every_tenant_viewer, url)
    # then: both pages answer 200, name the file and say what the index knows
    for page in (damaged, missing):
        assert 'id="archive-file-error"' in page and "The archive file cannot be read" in page
        assert f"cannot read archive file {segment.file_name}" in page
        assert intent.client_key in page and f"seq {ArchivedIntent.objects.get().head_seq}" in page
        assert 'id="archived-chain"' not in page
    assert "No such file or directory" in missing


def test_i36_an_edited_record_shows_its_chain_does_not_verify(
    settings: Any, archive_dir: Path, every_tenant_viewer: Client
) -> None:
    # given: the archived chain's first event's reason edited in the file
    intent = build("payments.charge", S.SUCCEEDED, settings=settings, approver=None)
    segment = archived(intent)
    path = archive_dir / segment.file_name
    with gzip.open(path, "rb") as handle:
        records = [json.loads(line) for line in handle]
    records[0]["audit_events"][0]["reason"] = "edited afterwards"
    with gzip.open(path, "wb") as handle:
        handle.write(b"".join(json.dumps(record).encode() + b"\n" for record in records))
    # when
    page = body(every_tenant_viewer, reverse("archived-intent", args=[intent.id]))
    # then
    assert 'id="chain-problems"' in page and "hash does not match the event&#x27;s content" in page


def test_i36_archived_intents_are_scoped_by_tenant_as_live_ones(
    settings: Any, acme_viewer: Client, every_tenant_viewer: Client
) -> None:
    # given: one archived charge of acme and one of globex, both under the same reference
    ours = submit(tenant="acme", reference="order-9", arguments=charge_arguments())
    theirs = submit(
        tenant="globex", principal="agent:agent-g", reference="order-9", arguments=charge_arguments()
    )
    for intent in (ours, theirs):
        intent_cancel(intent_id=intent.id, actor="user:vera", reason="not needed")
    archived(ours, theirs)
    # when / then: acme's viewer finds acme's only, by reference, id or key
    page = body(acme_viewer, reverse("intents"), q=ours.reference)
    assert "1 archived intent matches" in page
    assert str(ours.id)[:8] in page and str(theirs.id)[:8] not in page
    assert "archived intent" not in body(acme_viewer, reverse("intents"), q=str(theirs.id))
    assert "archived intent" not in body(acme_viewer, reverse("intents"), q=theirs.client_key)
    # and globex's pages are a 404, as for an intent that does not exist
    body(acme_viewer, reverse("archived-intent", args=[theirs.id]), status=404)
    body(acme_viewer, reverse("intent-detail", args=[theirs.id]), status=404)
    body(acme_viewer, reverse("archived-intent", args=[ours.id]))
    # while a viewer of every tenant sees both
    assert "2 archived intents match" in body(every_tenant_viewer, reverse("intents"), q=ours.reference)
    body(every_tenant_viewer, reverse("archived-intent", args=[theirs.id]))


def test_i36_the_dashboard_shows_the_live_size_and_the_archives(
    settings: Any, acme_viewer: Client, every_tenant_viewer: Client
) -> None:
    # given: two intents archived into one segment
    first = build("payments.charge", S.SUCCEEDED, settings=settings, approver=None)
    second = build("email.send", S.SUCCEEDED, settings=settings, approver=None)
    segment = archived(first, second)
    # when
    page = body(every_tenant_viewer, reverse("dashboard"))
    # then: the live database's size and the archive's, with its segments and intents
    live = re.search(r'id="live-bytes">([^<]+)<', page)
    assert live and re.search(r"\d", live.group(1)) and "0\xa0bytes" not in live.group(1)
    archive = re.search(r'id="archive-bytes">([^<]+)<', page)
    assert archive and "in 1 segment file, 2 intents written" in archive.group(1)
    assert f"{segment.bytes}\xa0bytes" in archive.group(1) or "KB" in archive.group(1)
    # and on the htmx refresh too; not for a role on named tenants (a figure of no tenant)
    stats = every_tenant_viewer.get(reverse("dashboard"), HTTP_HX_REQUEST="true").content.decode()
    assert 'id="archive-bytes"' in stats
    assert 'id="storage-sizes"' not in body(acme_viewer, reverse("dashboard"))
