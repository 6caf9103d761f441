"""The audit table refuses TRUNCATE as well (issue 11 item 1).

The row-level trigger of 0002 stops UPDATE and DELETE, but TRUNCATE fires no row triggers, so
``TRUNCATE operations_auditevent`` emptied the log and ``verify_audit`` then reported an intact
chain of 0 events. A statement-level ``BEFORE TRUNCATE`` trigger runs the same refusing function
(it reads only ``TG_OP``), also when the table is emptied by ``TRUNCATE ... CASCADE`` from
another table.

There is deliberately no escape hatch in the trigger (no session setting an ordinary role could
set): only what already bypasses the UPDATE/DELETE trigger bypasses this one, namely a
superuser's ``session_replication_role = replica`` or the table owner's ``ALTER TABLE ...
DISABLE TRIGGER``. The test suite's flush uses the former (tests/conftest.py).
"""

from __future__ import annotations

from django.db import migrations

REFUSE_TRUNCATE = """
CREATE TRIGGER operations_auditevent_no_truncate
    BEFORE TRUNCATE ON operations_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION operations_audit_append_only();
"""

DROP = "DROP TRIGGER IF EXISTS operations_auditevent_no_truncate ON operations_auditevent;"


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0010_intent_hold_reason"),
    ]

    operations = [
        migrations.RunSQL(REFUSE_TRUNCATE, DROP),
    ]
