"""The Drills page lists crash-lab and acceptance evidence; only admins can start a drill."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from console.lab.drills import drill_command
from console.lab.models import DrillRun
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def row(strategy: str, effects: int, missing: int, problems: list[str]) -> dict[str, Any]:
    return {"strategy": strategy, "provider": "payments", "boundary": "after-effect", "ops": 20, "effects": effects,
            "missing": missing, "duplicates": effects - 20 + missing, "requests": effects, "kills": 2,
            "problems": problems}  # fmt: skip


def test_drills_page_shows_tables_and_checks(viewer_client: Client) -> None:
    # given
    DrillRun.objects.create(
        kind="crashlab", started_at=timezone.now(), finished_at=timezone.now(), passed=False,
        result={"rows": [row("retry", 22, 0, []), row("ledger", 21, 0, ["21 effects for 20 operations"])]},
    )  # fmt: skip
    DrillRun.objects.create(
        kind="acceptance", started_at=timezone.now(), finished_at=timezone.now(), passed=True,
        result={"checks": [{"name": "two deliveries, one effect", "passed": True, "detail": "1 effect"}],
                "metrics": {"safe_effects": 1}},
    )  # fmt: skip
    # when
    response = viewer_client.get("/drills/")
    # then
    body = response.content.decode()
    assert response.status_code == 200
    assert "21 effects for 20 operations" in body and "FAIL" in body
    assert "two deliveries, one effect" in body and "safe_effects" in body
    assert "Run the acceptance gate" not in body  # viewers cannot start drills


def test_only_admins_can_start_a_drill(
    viewer_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        response = viewer_client.post("/drills/start", {"kind": "acceptance"}, follow=True)
    assert "Only admins of every tenant can start a drill." in response.content.decode()
    assert callbacks == []


def test_admin_starting_an_unknown_kind_is_refused(db: Any, django_capture_on_commit_callbacks: Any) -> None:
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/drills/start", {"kind": "delete-production"}, follow=True)
    assert "unknown drill kind" in response.content.decode()
    assert callbacks == []


def test_admin_start_queues_the_drill_after_commit(
    db: Any, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"  # a broker drills survive
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/drills/start", {"kind": "crashlab"}, follow=True)
    assert response.content.decode().count("queued") == 1  # shown once, not twice
    assert len(callbacks) == 1  # the task is sent only once the request's transaction commits


def test_a_drill_is_refused_on_the_filesystem_broker_before_anything_is_queued(
    db: Any, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    # given: quickstart's default broker, which a drill's killed workers do not survive
    settings.CELERY_BROKER_URL = "filesystem://"
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    # when
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/drills/start", {"kind": "acceptance"}, follow=True)
    # then: the reason is shown, nothing is queued, no run is recorded
    body = response.content.decode()
    assert "filesystem transport does not survive" in body and "CELERY_BROKER_URL" in body
    assert callbacks == []
    assert not DrillRun.objects.exists()


def test_drill_commands_target_the_lab_only() -> None:
    assert drill_command(kind="acceptance", requested_by="user:a")[-1] == "--acceptance"
    assert drill_command(kind="crashlab", requested_by="user:a")[-2:] == ["--ops", "20"]


def test_a_refused_drill_is_recorded_with_its_reason(db: Any, monkeypatch: Any) -> None:
    # given: the drill's command refuses to run (here: an unknown argument makes it exit 2)
    import console.lab.drills as drills

    original = drills.drill_command
    monkeypatch.setattr(drills, "drill_command", lambda **kwargs: [*original(**kwargs), "--no-such-flag"])
    # when
    code = drills.run_drill("crashlab", "user:admin")
    # then
    run = DrillRun.objects.get()
    assert code != 0 and run.passed is False and "no-such-flag" in run.error
