"""The health page's beat signal (issue 35, C27): exactly one Celery beat must run.

Every beat process records a heartbeat (``operations.workers.beat_heartbeat``). Two or more
seen within ``HEALTH_BEAT_WINDOW_SECONDS`` mean two schedulers: every periodic job is still
claimed once per period (``operations.services.periodic_claims``), but the deployment is not
what it should be, so the signal is red and names each beat. None seen within the window is
amber (the periodic jobs' own ages say whether anything runs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from operations.models import BeatHeartbeat
from operations.selectors.health_levels import AMBER, GREEN, RED, Signal, health_settings


@dataclass(frozen=True)
class BeatRow:
    """A beat process seen within the window; ``age_seconds`` since its last heartbeat."""

    identity: str
    host: str
    pid: int
    started_at: datetime
    seen_at: datetime
    age_seconds: float


def beats_seen(*, limit: int = 20) -> list[BeatRow]:
    """The beat processes whose last heartbeat is at most ``HEALTH_BEAT_WINDOW_SECONDS`` old
    (database clock), newest first."""
    window = float(health_settings()["HEALTH_BEAT_WINDOW_SECONDS"])
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT identity, host, pid, started_at, seen_at,
                   EXTRACT(EPOCH FROM statement_timestamp() - seen_at)
            FROM {BeatHeartbeat._meta.db_table}
            WHERE seen_at >= statement_timestamp() - make_interval(secs => %s)
            ORDER BY seen_at DESC LIMIT %s
            """,
            [window, limit],
        )
        return [
            BeatRow(identity, host, pid, started, seen, max(0.0, float(age)))
            for identity, host, pid, started, seen, age in cursor.fetchall()
        ]


def beats_signal(beats: list[BeatRow]) -> Signal:
    """Green for exactly one beat; red naming each when two or more ran within the window
    (run exactly one beat: docs/how-to/deploy.md); amber when none was seen."""
    window = float(health_settings()["HEALTH_BEAT_WINDOW_SECONDS"])
    if not beats:
        return Signal("beats", "Beat", AMBER, f"no beat seen in the last {window:.0f} s")
    named = ", ".join(f"{b.host} pid {b.pid} (started {b.started_at:%Y-%m-%d %H:%M:%S} UTC)" for b in beats)
    if len(beats) > 1:
        return Signal("beats", "Beat", RED, f"{len(beats)} beats running, run exactly one: {named}")
    return Signal("beats", "Beat", GREEN, f"one beat: {named}")
