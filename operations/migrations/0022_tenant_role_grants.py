"""Tenant-scoped console roles (issue 18 item 5), and the status rollup per tenant.

``RoleGrant`` says on which tenants a user holds a role (a group). The upgrade widens nothing
and locks nobody out: every existing group membership becomes a grant of that role on every
tenant (``*``), exactly what the membership meant before; from now on a membership without a
grant is the role on no tenant. Reversing drops the grants (memberships are untouched).

The status rollup is derived data, recounted by the beat every period: its table is dropped and
made again keyed by (tenant, status); until the first refresh the dashboard counts the settled
states exactly when they are few, as on a new installation.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


def grant_every_tenant_to_existing_members(apps, schema_editor):
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    RoleGrant = apps.get_model("operations", "RoleGrant")
    memberships = User.groups.through.objects.select_related("group").values_list("user_id", "group__name")
    RoleGrant.objects.bulk_create(
        [RoleGrant(user_id=user_id, role=name, tenant="*") for user_id, name in memberships.iterator()],
        batch_size=1000,
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0021_agent_scopes_and_tokens"),
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RoleGrant",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("role", models.CharField(help_text="the group this grant scopes", max_length=150)),
                ("tenant", models.CharField(help_text="a tenant, or * for every tenant", max_length=100)),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="role_grants",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("user", "role", "tenant"), name="role_grant_unique"),
                    models.CheckConstraint(
                        condition=models.Q(("role", ""), _negated=True), name="role_grant_role_named"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("tenant", ""), _negated=True), name="role_grant_tenant_named"
                    ),
                ],
            },
        ),
        migrations.RunPython(grant_every_tenant_to_existing_members, migrations.RunPython.noop),
        migrations.DeleteModel(name="StatusRollup"),
        migrations.CreateModel(
            name="StatusRollup",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tenant", models.CharField(max_length=100)),
                ("status", models.CharField(max_length=20)),
                ("count", models.BigIntegerField()),
                (
                    "computed_at",
                    models.DateTimeField(help_text="database time of the statement that counted"),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("tenant", "status"), name="status_rollup_tenant_status"),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["SUCCEEDED", "FAILED", "COMPENSATED", "REJECTED", "EXPIRED", "CANCELLED"],
                            )
                        ),
                        name="status_rollup_settled_status",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("count__gte", 0)), name="status_rollup_count_non_negative"
                    ),
                ],
            },
        ),
    ]
