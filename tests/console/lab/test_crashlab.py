"""The crash lab's verdict can fail: a control's measured row judged as the ledger's row is
reported with its duplicates or losses, and the command's exit status turns non-zero."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from console.lab.crashlab.report import markdown_table
from console.lab.crashlab.verdict import (
    DRILL,
    RESTORE,
    Row,
    judge,
    judge_control_row,
    judge_drill_row,
    judge_ledger_row,
    judge_restore_row,
)
from tests.support.workers import requires_real_broker


def row(strategy: str, boundary: str, effects: int, missing: int, kills: int = 10) -> Row:
    return Row(strategy=strategy, boundary=boundary, provider="payments", ops=100, interrupted=10,
               effects=effects, missing=missing, duplicates=effects - (100 - missing), active=effects,
               requests=effects, kills=kills)  # fmt: skip


def test_ledger_judge_reports_a_controls_duplicates_and_losses() -> None:
    # given the reference table's control rows, offered as if they were the ledger's
    duplicated = row("ledger", "after-effect", effects=110, missing=0)
    lost = row("ledger", "before-effect", effects=90, missing=10)
    # then
    assert judge_ledger_row(duplicated) == ["110 effects for 100 operations (10 duplicate(s))"]
    assert "10 operation(s) missing" in judge_ledger_row(lost)
    assert judge([duplicated, lost]) is False


def test_ledger_judge_passes_the_clean_row_and_requires_the_kills() -> None:
    assert judge_ledger_row(row("ledger", "after-effect", 100, 0)) == []
    assert judge_ledger_row(row("ledger", "after-effect", 100, 0, kills=7)) == ["7 kill(s) for 10 planned"]


def test_control_judge_demands_the_reference_failures() -> None:
    # a control that did NOT duplicate proves the crash was not real
    assert judge_control_row(row("retry", "after-effect", 100, 0)) == ["expected 10 duplicate(s), measured 0"]
    assert judge_control_row(row("record-before", "before-effect", 100, 0)) == [
        "expected 10 missing, measured 0"
    ]
    assert judge_control_row(row("record-after", "after-effect", 110, 0)) == []


@pytest.mark.integration
@requires_real_broker
@pytest.mark.django_db(transaction=True)
def test_measured_control_row_in_the_ledger_place_fails_the_command(tmp_path: Path) -> None:
    # given: a real, reduced run (workers killed with SIGKILL, sandbox ledger as ground truth)
    report = tmp_path / "lab.json"
    call_command(
        "crashlab", "--ops", "10", "--strategies", "retry,ledger", "--boundaries", "after-effect",
        "--no-variants", "--json", str(report),
    )  # fmt: skip
    data: dict[str, Any] = json.loads(report.read_text())
    control = next(r for r in data["rows"] if r["strategy"] == "retry")
    ledger = next(r for r in data["rows"] if r["strategy"] == "ledger")
    assert control["duplicates"] == 1 and ledger["duplicates"] == 0 and ledger["effects"] == 10
    # when: the control's measured numbers are judged as the ledger's row
    tampered = tmp_path / "tampered.json"
    swapped = {**control, "strategy": "ledger"}
    tampered.write_text(json.dumps({**data, "rows": [control, swapped]}))
    # then: the verdict fails and the exit status is non-zero; the genuine report passes
    with pytest.raises(SystemExit) as exit_info:
        call_command("crashlab", "--judge", str(tampered))
    assert exit_info.value.code == 1
    call_command("crashlab", "--judge", str(report))  # no SystemExit: PASS


def drill_row(*, created: int, found: int, compensated: int, flagged: int, missed: int) -> Row:
    # 4 email + 4 reservations intents, each sent twice; compensated duplicates are cancelled
    return Row(strategy=DRILL, boundary="operator-absent", provider="email+reservations", ops=8,
               interrupted=8, effects=8 + created, missing=0, duplicates=created,
               active=8 + created - compensated, requests=8 + created, kills=0, found=found,
               compensated=compensated, flagged=flagged, missed=missed)  # fmt: skip


def test_c18_duplicate_drill_judge_fails_on_a_miss_and_on_an_empty_drill() -> None:
    assert judge_drill_row(drill_row(created=8, found=8, compensated=4, flagged=4, missed=0)) == []
    # one duplicate found but its compensation never ended, one never found at all
    missed = drill_row(created=8, found=7, compensated=4, flagged=2, missed=2)
    assert judge_drill_row(missed) == [
        "2 of 8 duplicate(s) missed (neither compensated nor flagged)",
        "7 finding(s), but 4 compensated + 2 flagged",
    ]
    assert judge_drill_row(drill_row(created=0, found=0, compensated=0, flagged=0, missed=0)) == [
        "no duplicate was created: the drill exercised nothing"
    ]
    assert "| 8 / 8 / 4 / 4 / 0 |" in markdown_table(
        [drill_row(created=8, found=8, compensated=4, flagged=4, missed=0)], 10
    )


@pytest.mark.integration
@requires_real_broker
@pytest.mark.django_db(transaction=True)
def test_c18_duplicate_drill_flags_every_email_and_compensates_every_reservation(tmp_path: Path) -> None:
    # given: real workers and beat, the sandbox provider process; per provider, two intents
    # whose first send is lost with its effect (email: lookup lagging; reservations: a late
    # booking), resent after an operator's `absent` accepting the duplicate risk
    report = tmp_path / "drill.json"
    # when
    call_command("crashlab", "--drill-only", "--drill-intents", "2", "--json", str(report))
    # then: duplicates were created and the reconciler's checks handled every one of them
    (row,) = json.loads(report.read_text())["rows"]
    assert row["strategy"] == DRILL and row["problems"] == []
    assert row["duplicates"] > 0 and row["missed"] == 0
    assert row["compensated"] + row["flagged"] == row["found"] == row["duplicates"]
    email, reservations = row["detail"]["email"], row["detail"]["reservations"]
    assert email["resolved_absent"] == email["intents"] == 2
    assert email["flagged"] == email["created"] == 2 and email["compensated"] == 0
    assert reservations["compensated"] == reservations["created"] == 2 and reservations["flagged"] == 0
    assert reservations["active"] == reservations["intents"]  # one booking kept per intent


def restore_row(*, duplicates: int = 0, missing: int = 0, failed: int = 0, lost_by_restore: int = 9,
                recovered: bool = True) -> Row:  # fmt: skip
    kinds = {kind: {"references": 6} for kind in ("payments", "email", "reservations")}
    return Row(strategy=RESTORE, boundary="restore", provider="payments+email+reservations", ops=18,
               interrupted=lost_by_restore, effects=18 + duplicates - missing, missing=missing,
               duplicates=duplicates, active=18, requests=24, kills=0, failed_with_effect=failed,
               detail={**kinds, "recovery": {"by": "automatic", "ok": recovered}})  # fmt: skip


def test_i22_restore_drill_judge_holds_the_kill_drills_bar() -> None:
    # given a clean row, then rows with each failure the drill exists to catch
    assert judge_restore_row(restore_row()) == []
    # then
    assert judge_restore_row(restore_row(duplicates=2)) == ["2 duplicate effect(s) at the provider"]
    assert judge_restore_row(restore_row(missing=1)) == [
        "1 reference(s) lost (no effect, not in front of an operator)"
    ]
    assert judge_restore_row(restore_row(failed=1)) == ["1 intent(s) FAILED whose effect the provider holds"]
    assert judge_restore_row(restore_row(lost_by_restore=0)) == [
        "the restore lost no intent: the drill exercised nothing"
    ]
    assert judge_restore_row(restore_row(recovered=False)) == [
        "recovery did not finish and resume execution (automatic)"
    ]
    table = markdown_table([restore_row()], 20)
    assert "restore: lost by the restore / duplicates / lost / FAILED with effect / with an operator" in table
    assert "| 9 / 0 / 0 / 0 / 0 |" in table and table.rstrip().endswith("PASS |")


@pytest.mark.integration
@requires_real_broker
@pytest.mark.django_db(transaction=True)
# The automatic path is driven with real processes by tests/e2e/test_failover.py and by the
# crash lab's own run in .ci/run (crashlab --ops 20 and --acceptance); one variant here keeps
# the run short (each costs about 50 s, on both brokers).
@pytest.mark.parametrize("recovery", ["manage.py recover"])
def test_i22_restore_drill_leaves_one_effect_per_reference_and_loses_nothing(
    tmp_path: Path, recovery: str
) -> None:
    # given: real workers and beat on a scratch ledger database, the sandbox provider in its own
    # database; per kind, three intents before a pg_dump (done, RUNNING with the effect applied,
    # READY) and three after it
    report = tmp_path / "restore.json"
    by_command = ["--restore-by-command"] if recovery == "manage.py recover" else []
    # when: the ledger's database is restored from the dump (the checkpoint file ahead of it),
    # the workers restart and pause, recovery runs (by the workers or by the command), the
    # agent re-submits what was lost
    with contextlib.suppress(SystemExit):  # the row's problems are asserted below
        call_command(
            "crashlab", "--restore-only", "--restore-intents", "3", *by_command, "--json", str(report)
        )
    # then: at the provider, exactly one effect per reference, none FAILED with an effect
    (row,) = json.loads(report.read_text())["rows"]
    assert row["strategy"] == RESTORE and row["problems"] == [], row
    assert row["duplicates"] == 0 and row["missing"] == 0 and row["failed_with_effect"] == 0
    assert row["effects"] == row["ops"] == 18 and row["operator"] == 0
    assert row["detail"]["recovery"]["by"] == recovery and row["detail"]["recovery"]["ok"]
    for kind in ("payments", "email", "reservations"):
        counted = row["detail"][kind]
        assert counted["lost_by_restore"] == counted["resubmitted"] == 3
        at_dump = counted["at_dump"]  # done, held with its effect applied, submitted at the dump
        assert at_dump["SUCCEEDED"] == 1 and at_dump["RUNNING"] >= 1 and at_dump["lost"] == 3, kind
        assert at_dump["RUNNING"] + at_dump.get("READY", 0) == 2, kind
        assert counted["final"] == {"SUCCEEDED": 6}
