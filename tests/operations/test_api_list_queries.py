"""Issue 37: a page of ``GET /api/v1/intents`` reads what it shows beside each intent (its
newest outcome, a likely duplicate's event, the principal it is held behind) for the whole page
at once: the same queries for four intents as for twenty, and the same answer per intent as
when it is read by itself."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from operations.api.intent_representation import IntentSerializer
from operations.engine.protocol import execute_intent
from operations.models import Intent
from tests.factories import charge_arguments, make_agent, submit
from tests.support.processes import sandbox, sandbox_provider  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _group(n: int) -> None:
    """Four intents: a SUCCEEDED charge (an outcome), a likely duplicate of it (HELD for a
    person, its event), a READY charge and one HELD behind it (the principal it waits for)."""
    done = submit(arguments=charge_arguments(), reference=f"done-{n}")
    assert execute_intent(done.id) == "succeeded"
    submit(arguments=charge_arguments(), reference=f"done-{n}")
    submit(arguments=charge_arguments(), reference=f"open-{n}")
    submit(arguments=charge_arguments(), reference=f"open-{n}")


def _listed(client: APIClient) -> tuple[list[dict[str, Any]], int]:
    with CaptureQueriesContext(connection) as captured:
        answer = client.get("/api/v1/intents?page_size=50")
    assert answer.status_code == 200, answer.content
    return answer.json()["results"], len(captured.captured_queries)


def test_i37_a_list_page_costs_the_same_queries_for_four_intents_as_for_twenty(
    sandbox: Any,  # noqa: F811
) -> None:
    # given: the agent that submitted them (scope: the tenant's intents)
    _, token = make_agent("agent-1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    _group(0)
    client.get("/api/v1/intents")  # the token verified and cached
    # when: listed with four intents, then with twenty
    few, few_queries = _listed(client)
    for n in range(1, 5):
        _group(n)
    many, many_queries = _listed(client)
    # then: the same number of queries (before: one or two more per intent shown)
    assert (len(few), len(many)) == (4, 20)
    assert many_queries == few_queries, (few_queries, many_queries)
    statuses = {item["status"] for item in many}
    assert statuses == {"SUCCEEDED", "HELD", "READY"}
    assert any(item["likely_duplicate"] for item in many) and any(item["outcome"] for item in many)
    # and each intent is shown as when it is read by itself
    for item in many:
        alone = IntentSerializer(Intent.objects.get(id=item["intent_id"])).data
        assert {**item, "links": None} == {**alone, "links": None}
