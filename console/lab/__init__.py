"""The lab: everything that exercises the product without being part of it.

The sandbox provider (``sandbox_provider``), the crash lab (``crashlab``), the drills' runner
(``drills``), the benchmark (``bench``), the process harness (``cluster``) and their commands.
It imports ``console``, ``reconciliation`` and ``operations``; none of them imports it
(``lint-imports`` checks both directions). Production workers do not register its tasks: a
worker gets them only when started with ``--include`` of ``LAB_TASK_MODULES`` (see
``console.lab.cluster``), as the lab's own clusters and quickstart do.
"""

from __future__ import annotations

#: The modules that declare the lab's Celery tasks. Deliberately not named ``tasks``, so the
#: production app's autodiscovery (``<app>.tasks`` of every installed app) never finds them.
LAB_TASK_MODULES = (
    "console.lab.drills",
    "console.lab.crashlab.naive",
    "console.lab.bench.tasks",
)


def enable_sandbox() -> None:
    """Serve the sandbox provider's actions and event sources in this process and in every
    process it starts (``settings.EFFECT_LEDGER_SANDBOX``, ``EFFECT_LEDGER_SANDBOX=1``): the lab's
    commands are where the sandbox runs (issue 33 item 6)."""
    import os

    from django.conf import settings

    settings.EFFECT_LEDGER_SANDBOX = True
    os.environ["EFFECT_LEDGER_SANDBOX"] = "1"
