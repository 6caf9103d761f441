"""The machine export of the audit log (JSON Lines) carries the raw values exactly as hashed,
and an auditor re-checks it away from the database (shared/cases C12, issue 11)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from operations.audit.chain_checks import EXPORT_FIELDS
from operations.services import intent_cancel
from tests.factories import submit

pytestmark = pytest.mark.django_db

FORMULA = '=HYPERLINK("http://evil.example/","x")'


def export_to(client: Client, path: Path, **filters: str) -> list[dict]:
    response = client.get(reverse("audit-export-jsonl"), filters)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/jsonl")
    text = b"".join(response.streaming_content).decode()
    path.write_text(text, encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def verify_file(path: Path, *options: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit_export", str(path), *options, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()
    return 0, out.getvalue()


def test_c12_the_machine_export_keeps_the_raw_value_and_verifies(
    viewer_client: Client, tmp_path: Path
) -> None:
    # given: an agent cancels with a reason that is a spreadsheet formula
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason=FORMULA)
    other = submit()
    # when
    path = tmp_path / "audit.jsonl"
    records = export_to(viewer_client, path)
    # then: the raw reason, every hashed field, and the export re-checks intact
    cancelled = next(r for r in records if r["event"] == "cancelled")
    assert cancelled["reason"] == FORMULA and cancelled["intent_id"] == str(intent.id)
    assert set(EXPORT_FIELDS) == set(cancelled)
    assert {r["intent_id"] for r in records} == {str(intent.id), str(other.id)}
    assert verify_file(path) == (0, f"export intact: {path}: {len(records)} events in 2 chains\n")


def test_c12_an_edited_export_is_caught_by_name(viewer_client: Client, tmp_path: Path) -> None:
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason=FORMULA)
    path = tmp_path / "audit.jsonl"
    records = export_to(viewer_client, path)
    # when: somebody "cleans" the formula in the file
    edited = [dict(r, reason="'" + r["reason"]) if r["event"] == "cancelled" else r for r in records]
    path.write_text("\n".join(json.dumps(r) for r in edited) + "\n", encoding="utf-8")
    # then
    code, err = verify_file(path)
    cancelled = next(r for r in records if r["event"] == "cancelled")
    assert code == 1
    assert f"event id {cancelled['id']} (intent {intent.id}): hash does not match" in err


def test_c12_an_export_with_an_event_removed_is_caught(viewer_client: Client, tmp_path: Path) -> None:
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="no longer needed")
    path = tmp_path / "audit.jsonl"
    records = export_to(viewer_client, path, intent_id=str(intent.id))
    assert [r["seq"] for r in records] == [2, 1]  # newest first
    # when: a line is removed, then the file is filtered back to a complete-looking chain
    path.write_text(json.dumps(records[0]) + "\n" + json.dumps(dict(records[1], seq=3)) + "\n")
    code, err = verify_file(path)
    assert code == 1 and f"intent {intent.id}" in err


def test_c12_an_export_filtered_by_time_verifies_from_its_first_event(
    viewer_client: Client, tmp_path: Path
) -> None:
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="no longer needed")
    path = tmp_path / "audit.jsonl"
    records = export_to(viewer_client, path, intent_id=str(intent.id))
    path.write_text(json.dumps(records[0]) + "\n")  # only the newest event, seq 2
    code, out = verify_file(path)
    assert code == 0
    assert out.startswith(
        f"export intact: {path}: 1 events in 1 chains; 1 chains start after their first event"
    )
    # an auditor who asked for the whole log says so, and the missing start is a break
    code, err = verify_file(path, "--complete")
    assert code == 1 and "seq 2 where 1 was expected" in err
    assert f"export broken: {path}: 1 breaks; read 1 events in 1 chains" in err


@pytest.mark.parametrize(
    "content",
    ["not json\n", "[1, 2]\n", '{"id": 1}\n', json.dumps({f: "x" for f in EXPORT_FIELDS}) + "\n", "", "\n\n"],
)
def test_c12_a_file_that_is_no_export_is_refused_clearly(tmp_path: Path, content: str) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(content)
    with pytest.raises(CommandError, match="not a readable audit export") as refused:
        call_command("verify_audit_export", str(path))
    assert refused.value.returncode == 2


def test_c12_a_missing_file_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="not a readable audit export"):
        call_command("verify_audit_export", str(tmp_path / "absent.jsonl"))


def test_c12_an_invalid_filter_on_the_machine_export_is_400(viewer_client: Client) -> None:
    submit()
    response = viewer_client.get(reverse("audit-export-jsonl"), {"intent_id": "not-a-uuid"})
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert [e["field"] for e in response.json()["errors"]] == ["intent_id"]
