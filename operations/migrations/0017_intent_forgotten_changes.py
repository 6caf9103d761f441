"""A flag set by a recovery on intents a forgotten timeline changed (issue 22)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0016_execution_control"),
    ]

    operations = [
        migrations.AddField(
            model_name="intent",
            name="forgotten_changes",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="a recovery found that a timeline the database forgot (a restore, a failover) changed this intent after the restore point (cancelled? approved? sent?): before it is sent, the restore guard looks it up and holds it for a person when nothing is found (issue 22)",
            ),
        ),
    ]
