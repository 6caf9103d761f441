"""The lab's models, taken over from ``reconciliation`` without touching their tables.

``reconciliation`` 0002 created ``reconciliation_drillrun`` and ``reconciliation_laboperation``;
this migration only adds the models to the lab's state (same ``db_table``), and moves their
content types (and with them any permissions granted on them) from ``reconciliation`` to ``lab``.
"""

from django.db import migrations, models


def move_content_types(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in ("drillrun", "laboperation"):
        if not content_type.objects.filter(app_label="lab", model=model).exists():
            content_type.objects.filter(app_label="reconciliation", model=model).update(app_label="lab")


def restore_content_types(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in ("drillrun", "laboperation"):
        if not content_type.objects.filter(app_label="reconciliation", model=model).exists():
            content_type.objects.filter(app_label="lab", model=model).update(app_label="reconciliation")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("reconciliation", "0002_drills"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DrillRun",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[("crashlab", "Crash lab"), ("acceptance", "Acceptance gate")],
                                max_length=20,
                            ),
                        ),
                        ("started_at", models.DateTimeField()),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        ("passed", models.BooleanField(help_text="None while running", null=True)),
                        ("requested_by", models.CharField(default="cli", max_length=200)),
                        ("parameters", models.JSONField(blank=True, default=dict)),
                        (
                            "result",
                            models.JSONField(
                                blank=True, default=dict, help_text="rows / checks / metrics as printed"
                            ),
                        ),
                        ("markdown", models.TextField(blank=True, default="")),
                        ("error", models.TextField(blank=True, default="")),
                    ],
                    options={
                        "db_table": "reconciliation_drillrun",
                        "indexes": [models.Index(fields=["-started_at"], name="drill_started")],
                    },
                ),
                migrations.CreateModel(
                    name="LabOperation",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("run_key", models.CharField(max_length=64)),
                        ("strategy", models.CharField(max_length=30)),
                        ("reference", models.CharField(max_length=200, unique=True)),
                        ("amount", models.PositiveIntegerField()),
                        ("done", models.BooleanField(default=False)),
                        (
                            "finished",
                            models.BooleanField(default=False, help_text="a delivery ran to its end"),
                        ),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        (
                            "pid",
                            models.IntegerField(
                                blank=True, help_text="process making the current call", null=True
                            ),
                        ),
                    ],
                    options={
                        "db_table": "reconciliation_laboperation",
                        "indexes": [models.Index(fields=["run_key", "strategy"], name="labop_run")],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_types, restore_content_types),
    ]
