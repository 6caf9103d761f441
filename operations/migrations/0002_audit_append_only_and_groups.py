"""The audit table is append-only (a trigger refuses UPDATE and DELETE), and the console's
role groups exist from the start."""

from __future__ import annotations

from django.db import migrations

APPEND_ONLY = """
CREATE OR REPLACE FUNCTION operations_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % refused on operations_auditevent', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER operations_auditevent_append_only
    BEFORE UPDATE OR DELETE ON operations_auditevent
    FOR EACH ROW EXECUTE FUNCTION operations_audit_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS operations_auditevent_append_only ON operations_auditevent;
DROP FUNCTION IF EXISTS operations_audit_append_only();
"""

ROLES = ("viewer", "operator", "approver", "admin")


def create_groups(apps, schema_editor):  # type: ignore[no-untyped-def]
    group = apps.get_model("auth", "Group")
    for name in ROLES:
        group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunSQL(APPEND_ONLY, DROP),
        migrations.RunPython(create_groups, migrations.RunPython.noop),
    ]
