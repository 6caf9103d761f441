"""What an agent writes cannot pass for our words in a notice (issue 39, item 8): every value it
chose is one quoted, escaped line with no link, and Slack's control characters are escaped, so
the console's deep link is the only link and the only line that reads "Approval ..."."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import pytest
from django.core import mail
from django.urls import reverse
from rest_framework.test import APIClient

from operations.models import Intent, Notification
from operations.notifications.messages import notice_for, render_message
from operations.notifications.quoting import as_data
from operations.services.notifications import notifications_send
from tests.factories import UserFactory, charge_arguments, submit
from tests.operations.test_notifications import slack  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://ledger.example.test"
#: The reference of issue 39 item 8: a line that reads like ours, and a Slack link with a label.
FORGED = (
    "ord-77\nApproval waiting: https://evil.example/approvals/1/ <https://evil.example/login|Approve here>"
)
#: Anything a mail or chat client would make a link of: a URL's scheme, or the forged host.
LINKISH = re.compile(r"[a-z][a-z0-9+.-]*://|evil\.example", re.IGNORECASE)


@pytest.fixture(autouse=True)
def _notify_settings(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "PUBLIC_URL": PUBLIC_URL, "SLACK_WEBHOOK_URL": ""}


def approval_link(intent_id: object) -> str:
    return PUBLIC_URL + reverse("approval-detail", args=[intent_id])


def assert_only_our_line_and_link(text: str, ours: str) -> None:
    """``text`` has exactly one link, ``ours``, on the one line that starts with "Approval"."""
    approval_lines = [line for line in text.splitlines() if line.startswith("Approval")]
    assert approval_lines == [f"Approval requested: {ours}"], text
    assert [match.group(0) for match in LINKISH.finditer(text)] == ["https://"], text
    assert text.count(ours) == 1, text


def test_i39_8_a_forged_reference_adds_no_line_and_no_link_to_the_email_or_the_slack_notice(
    api: APIClient,
    slack: Any,  # noqa: F811 (the fixture)
) -> None:
    # given: an approver of acme, and agent-1 of acme submits a gated charge through the API
    # with the forged reference (the API takes any text up to 200 characters, newlines too)
    UserFactory(username="alice", groups=["approver"])
    response = api.post(
        "/api/v1/intents",
        {"action": "payments.charge", "arguments": charge_arguments(25_000), "reference": FORGED},
        format="json",
        HTTP_IDEMPOTENCY_KEY="forged-1",
    )
    assert response.status_code == 201, response.content
    intent = Intent.objects.get(id=response.json()["intent_id"])
    assert intent.status == Intent.Status.AWAITING_APPROVAL and intent.reference == FORGED
    # when: the beat's sender runs
    assert notifications_send() == 2  # the email and the webhook
    # then: the email has one "Approval" line and one link, ours; the reference is one line
    (message,) = mail.outbox
    assert_only_our_line_and_link(message.body, approval_link(intent.id))
    assert (
        '  Reference: "ord-77\\nApproval waiting: https[:]//evil[.]example/approvals/1/ '
        '<https[:]//evil[.]example/login|Approve here>"\n'
    ) in message.body
    # and the Slack text the same, with Slack's control characters escaped: no <...|label> link
    ((_, payload),) = slack.received
    text = payload["text"]
    assert "<" not in text and ">" not in text and "<https://evil" not in text
    assert_only_our_line_and_link(text, approval_link(intent.id))
    assert "&lt;https[:]//evil[.]example/login|Approve here&gt;" in text


CONTROLS = "a\rb\x1bc\u2028d\te\u2029f\x85g\u202eh\u200bi\x00j\x7fk\u00a0l"


def test_i39_8_control_characters_and_separators_are_escaped_onto_one_line() -> None:
    # when
    written = as_data(CONTROLS)
    # then: the escapes, in order, and nothing that is not visible text is left
    assert written == ('"a\\rb\\u001bc\\u2028d\\te\\u2029f\\u0085g\\u202eh\\u200bi\\u0000j\\u007fk\\u00a0l"')
    assert all(unicodedata.category(char)[0] not in "CZ" or char == " " for char in written)
    assert written.splitlines() == [written]
    # and quotes and backslashes cannot end the value early; links are defanged
    assert as_data('x" Risk: "low\\') == '"x\\" Risk: \\"low\\\\"'
    assert as_data("see http://10.0.0.1/a or mail evil.example") == (
        '"see http[:]//10[.]0[.]0[.]1/a or mail evil[.]example"'
    )
    # and text that needs nothing keeps its letters (a Japanese reference; a dot that ends a sentence)
    assert as_data("注文-77 paid.") == '"注文-77 paid."'


@pytest.mark.parametrize(
    ("spelling", "written"),
    [
        ("exa\u0308.com", '"exa\u0308[.]com"'),  # a combining mark before the dot
        ("evil\ufe52com", '"evil[.]com"'),  # small full stop (NFKC: ".")
        ("x\u2024com", '"x[.]com"'),  # one-dot leader (NFKC: ".")
        ("1.2.3.4/approve", '"1[.]2[.]3[.]4/approve"'),  # an IP address
        ("evil-.com", '"evil-[.]com"'),
        ("evil_.com", '"evil_[.]com"'),
        ("evil\uff0ecom", '"evil[.]com"'),  # full-width
    ],
)
def test_i39_8_a_host_in_any_spelling_is_defanged(spelling: str, written: str) -> None:
    # when / then (the newcomer's spellings that main's rule left as links)
    assert as_data(spelling) == written


@pytest.mark.parametrize("kind", [kind.value for kind in Notification.Kind])
def test_i39_8_every_kind_of_notice_writes_the_intents_values_as_data(kind: str) -> None:
    # given: an intent whose reference, principal and tenant were all chosen to forge lines
    intent = submit(
        arguments=charge_arguments(25_000),
        reference=CONTROLS.replace("\x00", "") + FORGED,  # PostgreSQL stores no NUL
        principal="agent:bot\r\nApproval requested: http://evil.example/",
        tenant="acme\u2028Risk: low",
    )
    notification, _ = Notification.objects.get_or_create(kind=kind, intent=intent)
    # when
    notice = notice_for(notification, intent)
    subject, body = render_message([notice, notice])
    # then: the headline line and one line per field, each field's value quoted on its line
    lines = notice.text().splitlines()
    assert lines[0] == f"{notice.headline}: {notice.link}"
    fields = [line.split(":", 1)[0].strip() for line in lines[1:]]
    assert fields[:6] == ["Action", "Amount", "Reference", "Principal", "Tenant", "Risk"]
    assert len(lines) == 1 + 7
    for label, value in (
        ("Reference", intent.reference),
        ("Principal", intent.principal),
        ("Tenant", intent.tenant),
    ):
        assert f"  {label}: {as_data(value)}" in lines
    # and in a digest of two, the only links are ours
    assert [m.group(0) for m in LINKISH.finditer(body)] == ["https://", "https://"]
    assert "\n" not in subject and "\r" not in subject
