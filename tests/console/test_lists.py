"""The lists' filters and sorts (issue 16 item 3): the approvals inbox, the UNKNOWN section of
the operators' queue and the intents search, sorted by indexed columns from a whitelist, filtered
by an intent id's first hex digits, a reference in any case and a principal's plain name, kept
in the URL and by the htmx refresh, and never wider than the reader's tenants."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from operations import selectors
from operations.access.tenants import EVERY_TENANT
from operations.models import Intent
from operations.selectors import InvalidCursor
from tests.console.conftest import gated, make_unknown, signed_in
from tests.factories import UserFactory, make_agent, submit

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
LISTS = ["approvals", "unknown", "intents"]


def in_list(list_name: str, **kwargs: Any) -> Intent:
    """An intent that the list ``list_name`` shows: AWAITING_APPROVAL, UNKNOWN, or any."""
    if list_name == "approvals":
        return gated(**kwargs)
    if list_name == "unknown":
        return make_unknown(**kwargs)
    return submit(**kwargs)


def get(client: Client, list_name: str, status: int = 200, **params: str) -> str:
    response = client.get(reverse(list_name), params)
    assert response.status_code == status, (list_name, params, response.status_code)
    return response.content.decode()


def order_of(body: str, intents: list[Intent]) -> list[Intent]:
    """``intents`` in the order ``body`` lists them (each must be listed)."""
    positions = {intent.id: body.find(str(intent.id)[:13]) for intent in intents}
    assert all(position >= 0 for position in positions.values()), positions
    return sorted(intents, key=lambda intent: positions[intent.id])


def shown(body: str, intent: Intent) -> bool:
    """Whether the list's rows name it (not the filter form or the refresh URL, which echo
    what was typed)."""
    rows = "".join(re.findall(r"<tr>.*?</tr>", body, re.DOTALL))
    return str(intent.id)[:13] in rows


def test_i16_3_each_sort_orders_the_approvals_inbox(viewer_client: Client) -> None:
    # given: a, b, c submitted in that order with risk 1, 4, 2 and expiring in 3, 1, 2 hours
    a, b, c = gated(), gated(), gated()
    now = timezone.now()
    for intent, risk, hours in ((a, 1, 3), (b, 4, 1), (c, 2, 2)):
        Intent.objects.filter(id=intent.id).update(
            risk_rank=risk, approval_expires_at=now + timedelta(hours=hours)
        )
    expected = {
        "": [b, c, a],  # the default: highest risk first
        "-risk": [b, c, a],
        "risk": [a, c, b],
        "-created": [c, b, a],
        "created": [a, b, c],
        "expiry": [b, c, a],
        "-expiry": [a, c, b],
    }
    assert set(expected) - {""} == set(selectors.APPROVAL_SORTS)
    for sort, order in expected.items():
        # when
        body = get(viewer_client, "approvals", sort=sort)
        # then
        assert order_of(body, [a, b, c]) == order, sort


def test_i16_3_each_sort_orders_the_unknown_section(viewer_client: Client) -> None:
    # given: a, b, c submitted in that order, UNKNOWN for 1, 3 and 2 hours
    a, b, c = make_unknown(), make_unknown(), make_unknown()
    now = timezone.now()
    for intent, hours in ((a, 1), (b, 3), (c, 2)):
        Intent.objects.filter(id=intent.id).update(updated_at=now - timedelta(hours=hours))
    expected = {
        "": [b, c, a],  # the default: UNKNOWN longest first
        "updated": [b, c, a],
        "-updated": [a, c, b],
        "created": [a, b, c],
        "-created": [c, b, a],
    }
    assert set(expected) - {""} == set(selectors.UNKNOWN_SORTS)
    for sort, order in expected.items():
        # when
        body = get(viewer_client, "unknown", sort=sort)
        # then
        assert order_of(body, [a, b, c]) == order, sort


def test_i16_3_each_sort_pages_the_intents_search_with_its_own_cursor(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: five intents
    intents = [submit() for _ in range(5)]
    for sort, order in (("-created", intents[::-1]), ("created", intents)):
        # when: every page of two rows is read, cursor after cursor
        seen: list[Intent] = []
        cursor = None
        while True:
            page = selectors.intent_search(
                selectors.IntentFilters(sort=sort), scope=EVERY_TENANT, cursor=cursor, limit=2
            )
            seen.extend(page.rows)
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        # then: each row once, in the sort's order
        assert [i.id for i in seen] == [i.id for i in order], sort
    # and the pages follow the same order through their "next" links, which keep the sort
    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    url: str | None = reverse("intents") + "?sort=created"
    seen_on_pages: list[Intent] = []
    while url:
        response = viewer_client.get(url)
        body = response.content.decode()
        assert response.status_code == 200 and "malformed" not in body
        seen_on_pages.extend(i for i in order_of(body, [i for i in intents if shown(body, i)]))
        link = re.search(r'<a class="next" href="([^"]+)"', body)
        url = html.unescape(link.group(1)) if link else None
        assert url is None or "sort=created" in url
    assert [i.id for i in seen_on_pages] == [i.id for i in intents]


def test_i16_3_a_cursor_from_another_sort_is_refused_not_followed(viewer_client: Client) -> None:
    # given: the cursor after the first two rows of the oldest-first search
    intents = [submit() for _ in range(4)]
    oldest_first = selectors.intent_search(
        selectors.IntentFilters(sort="created"), scope=EVERY_TENANT, limit=2
    )
    assert oldest_first.next_cursor
    # when / then: the newest-first search refuses it (its position means another row there)
    with pytest.raises(InvalidCursor):
        selectors.intent_search(
            selectors.IntentFilters(), scope=EVERY_TENANT, cursor=oldest_first.next_cursor
        )
    newest_first = selectors.intent_search(selectors.IntentFilters(), scope=EVERY_TENANT, limit=2)
    with pytest.raises(InvalidCursor):
        selectors.intent_search(
            selectors.IntentFilters(sort="created"), scope=EVERY_TENANT, cursor=newest_first.next_cursor
        )
    # and the page says so and starts again from its first page
    body = get(viewer_client, "intents", cursor=oldest_first.next_cursor)
    assert "That page link is malformed or out of date" in body
    assert order_of(body, intents) == intents[::-1]


@pytest.mark.parametrize("list_name", LISTS)
def test_i16_3_a_bad_sort_is_a_message_and_the_default_order(list_name: str, viewer_client: Client) -> None:
    # given
    first, second = in_list(list_name), in_list(list_name)
    for bad in ("bogus", "created_at; DROP TABLE operations_intent", "-arguments"):
        # when
        body = get(viewer_client, list_name, status=422, sort=bad)
        # then: a message naming the value, and the rows in the default order
        assert "is not a sort of this list" in html.unescape(body) and html.escape(bad)[:20] in body
        assert shown(body, first) and shown(body, second)
        default = get(viewer_client, list_name)
        assert order_of(body, [first, second]) == order_of(default, [first, second])


@pytest.mark.parametrize("list_name", LISTS)
def test_i16_3_a_non_hex_intent_id_is_a_message_not_a_500(list_name: str, viewer_client: Client) -> None:
    # given
    intent = in_list(list_name, reference="order-1")
    for bad in ("zz12", "12345678-xyz", "g" * 8, "0" * 33):
        # when: with a valid filter beside it
        body = get(viewer_client, list_name, status=422, intent_id=bad, reference="ORDER-1")
        # then: the message says what to type; the valid filter still applies
        assert "an intent_id is hex digits" in html.unescape(body)
        assert shown(body, intent)
        response = viewer_client.get(reverse(list_name), {"intent_id": bad}, **HTMX)  # type: ignore[arg-type]
        assert response.status_code == 422 and "an intent_id is hex digits" in html.unescape(
            response.content.decode()
        )


@pytest.mark.parametrize("list_name", LISTS)
def test_i16_3_an_intent_id_prefix_finds_it_with_or_without_dashes(
    list_name: str, viewer_client: Client
) -> None:
    # given: two intents of the list
    wanted, other = in_list(list_name), in_list(list_name)
    text = str(wanted.id)
    prefixes = [text[:8], text[:8].upper(), text[:13], text.replace("-", "")[:12], text, text.upper()]
    for prefix in prefixes:
        # when
        body = get(viewer_client, list_name, intent_id=prefix)
        # then
        assert shown(body, wanted) and not shown(body, other), prefix


def test_i16_3_the_search_box_takes_an_intent_id_prefix_or_a_reference_in_any_case(
    viewer_client: Client,
) -> None:
    # given
    wanted, other = submit(reference="Order-77"), submit(reference="order-770")
    # when / then: 8 hex digits are the start of an id
    body = get(viewer_client, "intents", q=str(wanted.id)[:8])
    assert shown(body, wanted) and not shown(body, other)
    # a reference is matched whole, in any case
    body = get(viewer_client, "intents", q="ORDER-77")
    assert shown(body, wanted) and not shown(body, other)
    # and a reference that is all hex digits is still found (as a reference or an id's start)
    numbered = submit(reference="12345678")
    body = get(viewer_client, "intents", q="12345678")
    assert shown(body, numbered) and not shown(body, wanted)


@pytest.mark.parametrize("list_name", LISTS)
def test_i16_3_a_reference_matches_in_any_case_whole_or_by_its_start(
    list_name: str, viewer_client: Client
) -> None:
    # given
    a, b = in_list(list_name, reference="Order-77"), in_list(list_name, reference="order-770")
    c = in_list(list_name, reference="other-1")
    # when / then: whole, in any case
    for typed in ("order-77", "ORDER-77", "Order-77"):
        body = get(viewer_client, list_name, reference=typed)
        assert shown(body, a) and not shown(body, b) and not shown(body, c), typed
    # by its start with a trailing *
    body = get(viewer_client, list_name, reference="ORDER-77*")
    assert shown(body, a) and shown(body, b) and not shown(body, c)
    # % and _ are not wildcards
    body = get(viewer_client, list_name, reference="order_77")
    assert not (shown(body, a) or shown(body, b))


def test_i16_3_the_actor_filter_finds_an_actor_by_the_name_people_know(viewer_client: Client) -> None:
    # given: one intent submitted by a person, one by an agent
    UserFactory(username="nora", groups=["operator"])
    by_nora = submit(principal="user:nora")
    by_agent = submit(principal="agent:agent-1")
    # when / then: the audit log by plain name
    body = get(viewer_client, "audit", actor="nora")
    assert str(by_nora.id)[:13] in body and str(by_agent.id)[:13] not in body
    body = get(viewer_client, "audit", actor="agent-1")
    assert str(by_agent.id)[:13] in body and str(by_nora.id)[:13] not in body
    # the full name still works
    body = get(viewer_client, "audit", actor="user:nora")
    assert str(by_nora.id)[:13] in body and str(by_agent.id)[:13] not in body
    # and the intents search's principal takes the plain name too
    body = get(viewer_client, "intents", principal="nora")
    assert shown(body, by_nora) and not shown(body, by_agent)


@pytest.mark.parametrize("list_name", ["approvals", "unknown"])
def test_i16_3_the_requester_filter_takes_a_plain_name(list_name: str, viewer_client: Client) -> None:
    # given
    UserFactory(username="nora", groups=["operator"])
    by_nora, by_agent = (
        in_list(list_name, principal="user:nora"),
        in_list(list_name, principal="agent:agent-1"),
    )
    # when / then
    body = get(viewer_client, list_name, principal="nora")
    assert shown(body, by_nora) and not shown(body, by_agent)
    body = get(viewer_client, list_name, principal="agent-1")
    assert shown(body, by_agent) and not shown(body, by_nora)


@pytest.mark.parametrize("list_name", LISTS)
def test_i16_3_no_filter_shows_another_tenants_rows(list_name: str) -> None:
    # given: a viewer of acme only; an acme and a globex intent with the same reference
    client = signed_in(UserFactory(username="amy", groups=["viewer"], tenants=["acme"]))
    ours = in_list(list_name, tenant="acme", reference="order-9")
    ours_too = in_list(list_name, tenant="acme", reference="order-90")
    theirs = in_list(list_name, tenant="globex", reference="order-9")
    searches = [
        {"tenant": "globex"},
        {"reference": "ORDER-9"},
        {"reference": "order-*"},
        {"intent_id": str(theirs.id)[:8]},
        {"intent_id": str(theirs.id)},
        {"principal": "agent-1"},
        {"sort": "created"},
        {"sort": "-created"},
    ]
    if list_name == "intents":
        searches += [{"q": str(theirs.id)[:8]}, {"q": "ORDER-9"}]
    for params in searches:
        # when
        body = get(client, list_name, **params)
        # then
        assert not shown(body, theirs), params
    # while the filters do narrow the rows it may read
    body = get(client, list_name, reference="ORDER-9")
    assert shown(body, ours) and not shown(body, ours_too)
    body = get(client, list_name, reference="order-9*")
    assert shown(body, ours) and shown(body, ours_too)


@pytest.mark.parametrize("list_name", ["approvals", "unknown", "intents"])
def test_i16_3_the_filters_and_sort_survive_the_htmx_refresh(list_name: str, viewer_client: Client) -> None:
    # given: a list opened with a reference filter and a sort
    a, b = in_list(list_name, reference="order-1"), in_list(list_name, reference="order-2")
    body = get(viewer_client, list_name, reference="ORDER-1", sort="created")
    assert shown(body, a) and not shown(body, b)
    # when: the polling refresh asks for what its hx-get names (the intents page: its next link)
    refresh = re.search(r'hx-get="([^"]+)"[^>]*hx-trigger="every', body)
    if list_name == "intents":
        assert 'name="reference" value="ORDER-1"' in body  # the form keeps them
        url = reverse("intents") + "?reference=ORDER-1&sort=created"
    else:
        assert refresh, body
        url = html.unescape(refresh.group(1))
        assert "reference=ORDER-1" in url and "sort=created" in url
    response = viewer_client.get(url, **HTMX)  # type: ignore[arg-type]
    # then: the same rows, and the next refresh names the same filters
    partial = response.content.decode()
    assert response.status_code == 200
    assert shown(partial, a) and not shown(partial, b)
    if list_name != "intents":
        again = re.search(r'hx-get="([^"]+)"', partial)
        assert again and html.unescape(again.group(1)) == url


@pytest.mark.parametrize("list_name", LISTS)
def test_i16_3_a_reference_whose_upper_case_changes_length_is_found(
    list_name: str, viewer_client: Client
) -> None:
    # given: references with letters Python and PostgreSQL upper-case differently ("ß" -> "SS"
    # in Python, kept by PostgreSQL; the "fi" ligature likewise): the reviewer found them by
    # their own reference nowhere
    strasse = in_list(list_name, reference="Straße-1")
    fish = in_list(list_name, reference="ﬁsh-1")
    # when / then: typed as stored, in another case, and by their start
    for typed, intent in (
        ("Straße-1", strasse),
        ("STRAßE-1", strasse),
        ("straße*", strasse),
        ("ﬁsh-1", fish),
    ):
        body = get(viewer_client, list_name, reference=typed)
        assert shown(body, intent), typed
    body = get(viewer_client, list_name, reference="Straße-1")
    assert not shown(body, fish)


@pytest.mark.parametrize("list_name", ["approvals", "unknown"])
def test_i16_3_a_list_longer_than_its_limit_says_more_wait(
    list_name: str, viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: three items where the list shows two (200 in production; the reviewer had 223
    # intents awaiting approval and 23 were hidden without a word)
    from console.views import approvals, unknown

    monkeypatch.setattr(approvals, "INBOX_LIMIT", 2)
    monkeypatch.setattr(unknown, "QUEUE_LIMIT", 2)
    items = [in_list(list_name, reference=f"order-{n}") for n in range(3)]
    # when
    body = get(viewer_client, list_name)
    # then: two rows and a notice that more wait, kept by the htmx refresh
    assert sum(shown(body, intent) for intent in items) == 2
    assert 'id="capped-notice"' in body and "Only the first 2 are shown" in body
    refreshed = viewer_client.get(reverse(list_name), **HTMX).content.decode()
    assert 'id="capped-notice"' in refreshed
    # and no notice when everything fits
    monkeypatch.setattr(approvals, "INBOX_LIMIT", 3)
    monkeypatch.setattr(unknown, "QUEUE_LIMIT", 3)
    assert 'id="capped-notice"' not in get(viewer_client, list_name)


def test_i16_3_every_refused_filter_is_named_apart(viewer_client: Client) -> None:
    # when: two fields fail at once (the reviewer saw their messages run together)
    body = html.unescape(get(viewer_client, "approvals", 422, sort="bogus", intent_id="xyz"))
    # then: one message per field, separated
    notice = body[body.index("Not applied:") :].split("</p>", 1)[0]
    assert notice.count("; ") >= 1 and "intent_id:" in notice and "sort:" in notice


def test_i16_3_a_generic_actions_target_never_shows_credentials_of_its_url(settings: Any) -> None:
    # given: a generic action whose URL carries a user and password, and no target_field
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": "https://svc-user:S3cr3tP4ss@api.acme.example:8443/v1/transfers"},
        "acme.notify": {"url": "https://api.acme.example/v1/notify"},
    }
    # when / then: the host and port only (the reviewer saw "svc-user:S3cr3tP4ss@...")
    assert (
        selectors.intent_target("acme.transfer", {"amount": 5, "currency": "EUR"}) == "api.acme.example:8443"
    )
    assert selectors.intent_target("acme.notify", {}) == "api.acme.example"


def test_i16_3_a_plain_name_matches_the_account_in_any_case_as_sign_in_does(viewer_client: Client) -> None:
    # given: intents by the account "nora" and the agent "bot2" (the reviewer typed OPALL, BOT2)
    UserFactory(username="nora", groups=["operator"])
    make_agent("agent-1")
    by_nora = submit(principal="user:nora")
    by_agent = submit(principal="agent:agent-1")
    # when / then: any case, fullwidth letters (NFKC), with or without the kind
    for typed in ("NORA", "Nora", "ｎｏｒａ", "user:NORA"):
        body = get(viewer_client, "audit", actor=typed)
        assert str(by_nora.id)[:13] in body and str(by_agent.id)[:13] not in body, typed
    body = get(viewer_client, "intents", principal="AGENT-1")
    assert shown(body, by_agent) and not shown(body, by_nora)
