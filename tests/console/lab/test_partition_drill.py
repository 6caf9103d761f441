"""The partition drill's checks that need no root: bad input, the reason it cannot run, and
the verdict on a run whose late write got through (tests/e2e/test_partition.py runs the drill)."""

from __future__ import annotations

from typing import Any

import pytest

from console.lab.crashlab import partition_drill
from console.lab.crashlab.partition_drill import PartitionNet, unavailable_reason
from console.lab.crashlab.partition_scenarios import PartitionResult, partition_table


@pytest.mark.parametrize(
    ("services", "message"), [({}, "at least one service"), ({"db": 70000}, "not a TCP port")]
)
def test_i35_partition_net_refuses_bad_services(services: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionNet(services)


def test_i35_partition_drill_names_why_it_cannot_run_without_root(monkeypatch: Any) -> None:
    # given: not root
    monkeypatch.setattr(partition_drill.os, "geteuid", lambda: 1000)
    # when / then
    assert unavailable_reason() == "the partition drill needs root (ip netns, veth pairs)"


def test_i35_a_late_write_that_got_through_is_a_violation() -> None:
    # given: the db-cut run of a ledger without the fence: the first attempt's late write moved
    # the intent, the second attempt's answer was refused, a third attempt ended it
    result = PartitionResult(
        scenario="db-cut",
        effects=1,
        fenced_late_writes=1,
        final_status="SUCCEEDED",
        ended_by="attempt 3",
        fences_at_provider=[1, 2, 3],
        evidence={"stale_write_refused": [{"data": {"fence": 2, "attempt_no": 2}}]},
    )
    # when
    problems = result.violations()
    # then
    assert "the cut-off worker's late write was not recorded as refused by the fence" in problems
    assert "writes of attempts [2] were refused: the late write got through" in problems
    assert "ended by attempt 3 (expected the second attempt or a look-up)" in problems
    assert "| db-cut | 1 | 1 | SUCCEEDED | attempt 3 | 1, 2, 3 |" in partition_table([result])


def test_c28_a_fenced_late_write_that_is_not_the_success_answer_is_a_violation() -> None:
    # given: a db-cut run whose refused late write carried a retry (the connection dropped), not
    # the provider's success answer: the dangerous late write (it would set the outcome) untested
    answer = {"code": "connection_dropped", "result": "retry"}
    evidence = {"stale_write_refused": [{"data": {"fence": 1, "attempt_no": 1, "provider_answer": answer}}]}
    result = PartitionResult(
        scenario="db-cut", effects=1, fenced_late_writes=1, final_status="SUCCEEDED",
        ended_by="second attempt", fences_at_provider=[1, 2], evidence=evidence,
    )  # fmt: skip
    # when / then
    assert result.violations() == ["the refused late write carried ['retry'], not the provider's success"]
    answer["result"] = "succeeded"
    assert result.violations() == []
