"""``DrillRun`` and ``LabOperation`` moved to the lab app (``console.lab``, label ``lab``).

State only: their tables (``reconciliation_drillrun``, ``reconciliation_laboperation``) stay, rows
and all; ``lab`` 0001 takes them over in its state with the same ``db_table``.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reconciliation", "0003_duplicate_findings"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="DrillRun"),
                migrations.DeleteModel(name="LabOperation"),
            ],
            database_operations=[],
        ),
    ]
