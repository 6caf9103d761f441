"""Issue 39 items 6 and 10 in the console: the statements page is in the navigation, a refused
upload opens the column mapping of its own source (and a file with the default header needs
none), and an upload returns at once while the page shows the import's progress."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from operations.models import OutboxMessage
from reconciliation.models import StatementLine, StatementRun, StatementUpload
from reconciliation.statement_csv import save_mapping
from reconciliation.statement_uploads import IMPORT_TASK, statement_upload_accept, statement_upload_import
from tests.console.conftest import signed_in
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

SOURCE = "sandbox-payments"  # not the first source (sandbox-email is)
HTMX = {"HTTP_HX_REQUEST": "true"}


def upload(client: Client, data: bytes, *, source: str = SOURCE, htmx: bool = True) -> Any:
    return client.post(
        reverse("statement-upload"),
        {"source": source, "date": "2026-03-10", "file": SimpleUploadedFile("s.csv", data)},
        **(HTMX if htmx else {}),
    )


def mapping_form_source(html: str) -> str:
    found = re.search(
        r'<form method="post" action="/statements/mapping".*?name="source" value="([^"]*)"', html, re.S
    )
    assert found, "the mapping form is shown"
    return found.group(1)


def selected_upload_source(html: str) -> str:
    found = re.search(r'<select id="upload-source" name="source">(.*?)</select>', html, re.S)
    assert found
    chosen = re.search(r"<option selected>([^<]+)</option>", found.group(1))
    return chosen.group(1) if chosen else ""


def test_i39_6_statements_are_in_the_navigation_of_every_tenants_roles(operator_client: Client) -> None:
    # when / then: a role on every tenant sees the link, marked current on the page itself
    assert 'href="/statements/"' in operator_client.get(reverse("dashboard")).content.decode()
    page = operator_client.get(reverse("statements")).content.decode()
    assert '<a href="/statements/" aria-current="page">Statements</a>' in page
    # and: a role on named tenants only, for whom the page is refused, does not
    named = signed_in(UserFactory(username="nadia", groups=["operator"], tenants=["acme"]))
    assert 'href="/statements/"' not in named.get(reverse("dashboard")).content.decode()
    assert named.get(reverse("statements")).status_code == 403


def test_i39_6_an_upload_refused_for_want_of_a_mapping_opens_that_sources_mapping(
    operator_client: Client,
) -> None:
    # given: no mapping saved, and a file whose header is not the default one
    # when
    refused = upload(operator_client, b"Charge ID,Amount,Currency\nch_1,49.90,EUR\n", htmx=False)
    # then: refused, and the mapping form (and the upload form) are on the source uploaded
    html = refused.content.decode()
    assert refused.status_code == 422 and "sandbox-payments has no saved column mapping" in html
    assert mapping_form_source(html) == SOURCE
    assert '<span class="mono" id="mapping-source">sandbox-payments</span>' in html
    assert selected_upload_source(html) == SOURCE
    assert not StatementUpload.objects.exists() and not StatementRun.objects.exists()


def test_i39_6_any_refused_upload_keeps_its_source_in_both_forms(operator_client: Client) -> None:
    save_mapping(source=SOURCE, columns={"provider_reference": "Charge ID"}, actor="user:otto")
    refused = upload(operator_client, b"Charge ID\n\xff\n")
    html = refused.content.decode()
    assert refused.status_code == 422 and "not UTF-8" in html
    assert mapping_form_source(html) == SOURCE and selected_upload_source(html) == SOURCE


def test_i39_6_the_mapping_form_offers_the_default_until_one_is_saved(operator_client: Client) -> None:
    # when
    page = operator_client.get(reverse("statements") + f"?source={SOURCE}").content.decode()
    # then: open on the source asked for, with each column named like its field
    assert mapping_form_source(page) == SOURCE and selected_upload_source(page) == SOURCE
    assert (
        'id="map-provider_reference" name="provider_reference" value="" placeholder="provider_reference"'
        in page
    )
    assert 'id="map-amount" name="amount" value="" placeholder="amount"' in page
    assert 'id="mapping-default"' in page
    # and: once saved, the saved one
    save_mapping(source=SOURCE, columns={"provider_reference": "Charge ID"}, actor="user:otto")
    page = operator_client.get(reverse("statements") + f"?source={SOURCE}").content.decode()
    assert 'id="map-provider_reference" name="provider_reference" value="Charge ID">' in page
    assert 'id="map-amount" name="amount" value="">' in page and 'id="mapping-default"' not in page


def test_i39_6_a_file_with_the_default_header_needs_no_saved_mapping(operator_client: Client) -> None:
    # given: no mapping saved
    data = b"provider_reference,amount,currency\nch_1,49.90,EUR\nch_2,1.00,EUR\n"
    # when
    accepted = upload(operator_client, data)
    # then: accepted and read with the columns its header names
    assert accepted.status_code == 200, accepted.content.decode()
    queued = StatementUpload.objects.get()
    assert queued.columns == {
        "provider_reference": "provider_reference",
        "amount": "amount",
        "currency": "currency",
    }
    statement_upload_import(upload_id=queued.id, message_id=queued.message_id)
    assert sorted(StatementLine.objects.values_list("provider_reference", "amount")) == [
        ("ch_1", 4990),
        ("ch_2", 100),
    ]


def test_i39_10_an_upload_answers_at_once_with_a_queued_import_and_no_line_yet(
    operator_client: Client,
) -> None:
    # given
    save_mapping(
        source=SOURCE,
        columns={"provider_reference": "Charge ID", "amount": "Amount", "currency": "Currency"},
        actor="user:otto",
    )
    data = b"Charge ID,Amount,Currency\n" + b"".join(b"ch_%d,49.90,EUR\n" % n for n in range(5000))
    # when
    answer = upload(operator_client, data, htmx=False)
    # then: redirected to the page, the import queued with its message, nothing imported yet
    assert answer.status_code == 302 and answer["Location"] == f"/statements/?source={SOURCE}"
    queued = StatementUpload.objects.get()
    assert (queued.status, queued.total_lines, queued.lines_done) == ("queued", 5000, 0)
    assert OutboxMessage.objects.get(id=queued.message_id).task == IMPORT_TASK
    assert not StatementLine.objects.exists()
    page = operator_client.get(answer["Location"]).content.decode()
    assert "imported in the background" in page and "5000 lines wait for a worker" in page


def test_i39_10_a_bad_file_is_refused_at_upload_with_its_line_and_no_job(operator_client: Client) -> None:
    save_mapping(
        source=SOURCE,
        columns={"provider_reference": "Charge ID", "amount": "Amount", "currency": "Currency"},
        actor="user:otto",
    )
    refused = upload(operator_client, b"Charge ID,Amount,Currency\nch_1,49.90,EUR\nch_2,lots,EUR\n")
    assert refused.status_code == 422
    assert (
        "Refused: line 3, column &#x27;Amount&#x27;: &#x27;lots&#x27; is not an amount"
        in refused.content.decode()
    )
    assert not StatementUpload.objects.exists() and not StatementRun.objects.exists()
    assert not OutboxMessage.objects.filter(task=IMPORT_TASK).exists()


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"", "the file is empty"),
        (b"\n\n\n", "the file is empty"),
        ("provider_reference\nch_\u00e9\n".encode("latin-1"), "line 2: the file is not UTF-8 (byte 23)"),
        ("provider_reference\n".encode("utf-16"), "line 1: the file is not UTF-8 (byte 1)"),
    ],
)
def test_i39_6_an_empty_or_mis_encoded_file_is_told_so_not_sent_to_the_mapping(
    operator_client: Client, data: bytes, said: str
) -> None:
    # given: a source with no saved mapping (main: every such file was "no saved column mapping")
    # when
    refused = upload(operator_client, data)
    # then: the file's own problem, nothing stored
    html = refused.content.decode()
    assert refused.status_code == 422 and said in html, html[:3000]
    assert "no saved column mapping" not in html
    assert not StatementUpload.objects.exists() and not StatementRun.objects.exists()


def test_i39_10_the_same_file_twice_is_said_and_imported_once(operator_client: Client) -> None:
    data = b"provider_reference\nch_1\n"
    assert upload(operator_client, data).status_code == 200
    again = upload(operator_client, data)
    html = again.content.decode()
    assert (
        again.status_code == 422
        and "this file was already uploaded as the statement of sandbox-payments" in html
    )
    assert "nothing was imported again" in html and StatementUpload.objects.count() == 1


def in_state(state: str) -> StatementUpload:
    """An upload of 2,500 lines in ``state`` (its progress as a worker leaves it)."""
    data = b"provider_reference\n" + b"".join(b"ch_%d\n" % n for n in range(2500))
    accepted = statement_upload_accept(
        source=SOURCE, day=dt.date(2026, 3, 10), data=data, filename="big.csv", actor="user:otto"
    )
    if state == "running":
        statement_upload_import(upload_id=accepted.id, message_id=accepted.message_id, seconds=0)
    elif state == "done":
        statement_upload_import(upload_id=accepted.id, message_id=accepted.message_id)
    elif state == "failed":
        StatementUpload.objects.filter(id=accepted.id).update(status="failed", lines_done=1000, error="x")
        StatementRun.objects.filter(id=accepted.run_id).update(
            error="the import stopped after 1000 of 2500 lines (those stay imported): OSError()"
        )
    accepted.refresh_from_db()
    assert accepted.status == state
    return accepted


@pytest.mark.parametrize(
    ("state", "shown", "polls"),
    [
        ("queued", ['class="status-running upload-queued">queued', "2500 lines wait for a worker"], True),
        (
            "running",
            [
                'class="status-running upload-running">importing',
                '<progress value="1000" max="2500"',
                "1000 of 2500 lines",
            ],
            True,
        ),
        ("done", ['class="status-ok upload-done">done', "2500 lines, finished"], False),
        (
            "failed",
            [
                'class="status-bad upload-failed">failed',
                "1000 of 2500 lines imported",
                "the import stopped after 1000 of 2500 lines",
            ],
            False,
        ),
    ],
)
def test_i39_10_the_progress_partial_shows_every_state_and_polls_while_it_runs(
    operator_client: Client, state: str, shown: list[str], polls: bool
) -> None:
    # given
    in_state(state)
    # when: the page polls its runs
    partial = operator_client.get(reverse("statements"), **HTMX)
    html = partial.content.decode()
    # then: the runs alone, with the upload's state, refreshed only while it is not finished
    assert partial.status_code == 200 and "<html" not in html and 'id="upload-file"' not in html
    assert html.lstrip().startswith('<section id="statement-activity"')
    for text in shown:
        assert text in html, text
    assert ('hx-trigger="every 2s"' in html) == polls
    assert "big.csv" in html
