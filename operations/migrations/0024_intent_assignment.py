"""Operators' assignments ("I'm on it", issue 16 item 4): who is on an item of the operators'
queue and since when. Both columns are empty for every existing intent (nobody is on anything);
adding them rewrites no row (a constant database default)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0023_health_heartbeats_and_periodic_runs"),
    ]

    operations = [
        migrations.AddField(
            model_name="intent",
            name="assigned_at",
            field=models.DateTimeField(
                blank=True,
                help_text="when assigned_to took it; the assignment lapses EFFECT_LEDGER_ASSIGNMENT_SECONDS later",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="intent",
            name="assigned_to",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="username of the operator who said \"I'm on it\" for this item of the operators' queue (operations.services.assignment); blank when nobody is. Ends on any change of status",
                max_length=150,
            ),
        ),
    ]
