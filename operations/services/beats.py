"""The write behind the health page's beat signal: one beat process's heartbeat (issue 35)."""

from __future__ import annotations

from datetime import datetime, timedelta

from operations.models import BeatHeartbeat
from operations.services.health import heartbeat_cursor

#: Rows of beats silent for longer than this are deleted by the next heartbeat of any beat.
BEAT_RETENTION = timedelta(days=1)


def beat_heartbeat_record(*, identity: str, host: str, pid: int, started_at: datetime) -> None:
    """Upsert a beat process's heartbeat: ``seen_at`` = database now.

    Args:
        identity: ``host:pid:start``, the row's key (one per beat process).
        host: the machine's name.
        pid: the beat's process id.
        started_at: when the beat process started (aware datetime).

    Raises:
        ValueError: ``identity`` or ``host`` is blank or longer than 255 characters.
    """
    for name, value in (("identity", identity), ("host", host)):
        if not value.strip() or len(value) > 255:
            raise ValueError(f"a beat heartbeat's {name} must be 1 to 255 characters, not {value!r}")
    table = BeatHeartbeat._meta.db_table
    with heartbeat_cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (identity, host, pid, started_at, seen_at)
            VALUES (%s, %s, %s, %s, statement_timestamp())
            ON CONFLICT (identity) DO UPDATE SET seen_at = EXCLUDED.seen_at
            """,
            [identity, host, pid, started_at],
        )
        cursor.execute(
            f"DELETE FROM {table} WHERE seen_at < statement_timestamp() - make_interval(secs => %s)",
            [BEAT_RETENTION.total_seconds()],
        )
