"""The partition drill (issue 35, case C28): real Celery workers in their own network namespaces,
their paths to PostgreSQL, the broker and the sandbox provider on veth pairs and socat forwarders
(``console.lab.crashlab.partition_drill``), cut and healed mid-call; the real broker, database
and provider. Needs root and ``ip netns``: skipped with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from console.lab.crashlab.partition_drill import PartitionNet, unavailable_reason
from console.lab.crashlab.partition_scenarios import PartitionDrill, partition_table, service_ports
from operations.models import Attempt, AuditEvent, Intent, Outcome
from tests.support.workers import Cluster, requires_real_broker

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), requires_real_broker]

REASON = unavailable_reason()


@pytest.fixture
def drill(cluster: Cluster, sandbox: Any) -> Iterator[PartitionDrill]:
    """Two namespaced workers (``a``, ``b``) and beat on the test database and sandbox."""
    if REASON:
        print(f"partition drill skipped: {REASON}")  # noqa: T201 - the reason, also in -rs
        pytest.skip(REASON)
    with PartitionNet(service_ports(sandbox.url)) as net, PartitionDrill(cluster, net) as running:
        yield running


def test_c28_late_write_after_a_database_cut_is_fenced_and_one_charge_remains(drill: PartitionDrill) -> None:
    # given: a charge the provider applies, then answers with success after holding the answer
    # when: the claiming worker's path to PostgreSQL is cut right then (it receives the success
    # but cannot record it), healed while a takeover's attempt is at the provider
    result = drill.run("db-cut")
    print(partition_table([result]), result.evidence)  # noqa: T201 - the drill's row, for the log
    # then: one charge; SUCCEEDED by the second attempt's answer or a look-up
    assert result.effects == 1, result
    intent = Intent.objects.get(id=result.intent_id)
    assert intent.status == Intent.Status.SUCCEEDED
    assert result.ended_by in {"second attempt", "lookup"}, result
    # and the first worker's late write, of the provider's success answer, was refused by the
    # fence and recorded with that answer (it would have set the intent's outcome)
    refused = AuditEvent.objects.get(intent=intent, event="stale_write_refused")
    assert refused.data["fence"] == 1 and refused.data["attempt_no"] == 1
    assert refused.data["provider_answer"]["result"] == Attempt.Result.SUCCEEDED, refused.data
    assert refused.data["would_have_become"] == Intent.Status.SUCCEEDED, refused.data
    outcome = Outcome.objects.get(intent=intent)
    assert refused.data["provider_answer"]["provider_reference"] == outcome.provider_reference
    first = Attempt.objects.get(intent=intent, attempt_no=1)
    assert first.detail["provider_answer"]["result"] == Attempt.Result.SUCCEEDED
    assert intent.fence > refused.data["fence"]
    assert Attempt.objects.get(intent=intent, attempt_no=1).result == Attempt.Result.FENCED_OUT
    if drill.net.capped_backoff:
        # it landed while the takeover's attempt was RUNNING: only the fence refused it
        assert result.evidence["late_write_before_second_answer"], result
    # and the provider saw the first fence, then the takeover's higher one
    assert result.fences_at_provider[0] == 1 and result.fences_at_provider == sorted(
        result.fences_at_provider
    )
    assert result.violations() == []


def test_i35_a_broker_cut_mid_call_still_ends_with_one_charge(drill: PartitionDrill) -> None:
    # given: a charge the provider answers late
    # when: the claiming worker's path to the broker is cut while it waits, the broker's side of
    # its connection ended (its delivery requeued), then healed
    result = drill.run("broker-cut")
    print(partition_table([result]), result.evidence)  # noqa: T201 - the drill's row, for the log
    # then: the answer was recorded through the database; one charge, SUCCEEDED
    assert result.effects == 1, result
    assert Intent.objects.get(id=result.intent_id).status == Intent.Status.SUCCEEDED
    assert result.fences_at_provider == [1], result
    assert result.violations() == []
