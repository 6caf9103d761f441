"""The failover drill (issue 35): a streaming replica that lags is promoted on real PostgreSQL
replication, with real workers, beat, broker and sandbox provider (``manage.py crashlab
--failover``); and its verdict can fail."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from console.lab.crashlab.replica_pair import server_bindir
from console.lab.crashlab.report import FAILOVER_HEADER, markdown_table
from console.lab.crashlab.verdict import FAILOVER, Row, judge
from tests.support.workers import requires_real_broker

KINDS = ("payments", "email", "reservations")


def failover_row(*, duplicates: int = 0, missing: int = 0, lag: dict[str, int] | None = None) -> Row:
    lag = {"wal_bytes_behind": 81920, "primary_intents": 18, "promoted_intents": 9} if lag is None else lag
    return Row(strategy=FAILOVER, boundary="failover", provider="+".join(KINDS), ops=18, interrupted=9,
               effects=18 + duplicates - missing, missing=missing, duplicates=duplicates, active=18,
               requests=18, kills=0,
               detail={**{k: {"references": 6} for k in KINDS}, "recovery": {"ok": True}, "lag": lag})  # fmt: skip


def test_i35_failover_judge_wants_no_duplicate_no_loss_and_a_real_lag() -> None:
    # given a clean row, then rows with a duplicate, a loss, and no lag at all
    clean, duplicated, lost = failover_row(), failover_row(duplicates=1), failover_row(missing=1)
    level = failover_row(lag={"wal_bytes_behind": 0, "primary_intents": 18, "promoted_intents": 18})
    # when
    passed = judge([clean])
    judge([duplicated, lost, level])
    # then
    assert passed and clean.problems == []
    assert duplicated.problems == ["1 duplicate effect(s) at the provider"]
    assert lost.problems == ["1 reference(s) lost (no effect, not in front of an operator)"]
    assert level.problems == [
        "the promoted replica was not behind the primary's WAL: no lag to fail over from",
        "the promoted database held 18 of the primary's 18 intents: it lacked no commit",
    ]
    table = markdown_table([clean], 0)
    assert FAILOVER_HEADER in table and "| 9 / 0 / 0 / 0 / 0 |" in table and table.rstrip().endswith("PASS |")


@requires_real_broker
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failover-intents", "2"], "--failover-intents must be at least 3"),
        (["--restore-only"], "--failover and --restore-only exclude each other"),
    ],
)
def test_i35_failover_drill_refuses_bad_options_before_it_starts_anything(
    args: list[str], message: str, settings: Any
) -> None:
    # given: the command's own change to the rate limits is undone after the test
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER}
    # when / then: refused with the reason, before any server, worker or database row exists
    with pytest.raises(CommandError, match=message):
        call_command("crashlab", "--failover", *args)


@pytest.mark.integration
@requires_real_broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    server_bindir() is None,
    reason="the failover drill needs the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup, "
    "postgres) in `pg_config --bindir`",
)
def test_i35_failover_drill_promotes_a_lagging_replica_with_no_duplicate_and_no_loss(tmp_path: Path) -> None:
    # given: a private primary and its streaming replica, the ledger on the primary, the sandbox
    # provider on the shared server; per kind three intents before the replica is cut off (done,
    # RUNNING with its effect applied, READY) and three after it
    report = tmp_path / "failover.json"
    # when: the primary stops hard, the lagging replica is promoted, the workers restart on it
    # and recover by themselves, the agent re-submits what the promotion lost
    with contextlib.suppress(SystemExit):  # the row's problems are asserted below
        call_command("crashlab", "--failover", "--failover-intents", "3", "--json", str(report))
    # then: the promoted database really lacked the primary's last commits
    (row,) = json.loads(report.read_text())["rows"]
    lag = row["detail"]["lag"]
    assert lag["wal_bytes_behind"] > 0, lag
    assert lag["primary_intents"] == 18 and lag["promoted_intents"] == 9, lag
    # and at the provider: exactly one effect per reference, nothing lost, none FAILED with an effect
    assert row["strategy"] == FAILOVER and row["problems"] == [], row
    assert row["duplicates"] == 0 and row["missing"] == 0 and row["failed_with_effect"] == 0
    assert row["effects"] == row["ops"] == 18 and row["operator"] == 0
    assert row["detail"]["recovery"]["by"] == "automatic" and row["detail"]["recovery"]["ok"]
    for kind in KINDS:
        counted = row["detail"][kind]
        assert counted["lost_by_restore"] == counted["resubmitted"] == 3, kind
        at_cut = counted["at_dump"]  # done, held with its effect applied, submitted at the cut
        assert at_cut["SUCCEEDED"] == 1 and at_cut["RUNNING"] >= 1 and at_cut["lost"] == 3, kind
        assert at_cut["RUNNING"] + at_cut.get("READY", 0) == 2, kind
        assert counted["final"] == {"SUCCEEDED": 6}, kind
