"""Agents' reach and tokens (issue 18, items 6 and 7).

- ``Agent.actions`` and ``Agent.scope``: agents that exist keep what they could do before, every
  action and their whole tenant's intents (``["*"]``, ``tenant``); agents created from now on
  default to their own intents (``own``).
- ``AgentToken``: each agent's token digest moves into its own row (no expiry), so an agent can
  hold two valid tokens during a rotation; ``Agent.token_digest`` goes.
- ``effect_ledger_cache``: the table of Django's database cache (the schema ``createcachetable``
  writes), which the API's rate limits share between web processes when no Redis is configured
  (``CACHES["throttle"]`` in console/settings.py). Created here so that every deployment that
  migrates has it, whatever its cache setting was at the time.

Not reversible once agents exist (the digest column would come back empty).
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

CACHE_TABLE = "effect_ledger_cache"


def keep_existing_agents_reach(apps: Any, schema_editor: Any) -> None:
    Agent = apps.get_model("operations", "Agent")
    Agent.objects.update(actions=["*"], scope="tenant")


def move_digests_to_tokens(apps: Any, schema_editor: Any) -> None:
    Agent = apps.get_model("operations", "Agent")
    AgentToken = apps.get_model("operations", "AgentToken")
    AgentToken.objects.bulk_create(
        AgentToken(agent_id=agent_id, digest=digest)
        for agent_id, digest in Agent.objects.values_list("id", "token_digest")
    )


class Migration(migrations.Migration):
    dependencies = [("operations", "0020_spend_reservations")]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="actions",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text='action patterns it may submit and preview: "payments.*", "email.send", "*" '
                "(operations.scopes.action_allowed); empty: none",
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="scope",
            field=models.CharField(
                choices=[("own", "Its own intents"), ("tenant", "Every intent of its tenant")],
                default="own",
                help_text="which intents it reads, lists and cancels: its own, or its whole tenant's",
                max_length=10,
            ),
        ),
        migrations.RunPython(keep_existing_agents_reach, migrations.RunPython.noop),
        migrations.CreateModel(
            name="AgentToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("digest", models.CharField(help_text="sha256 hex of the token", max_length=64, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "expires_at",
                    models.DateTimeField(
                        blank=True, help_text="refused from then on; empty: never", null=True
                    ),
                ),
                ("revoked_at", models.DateTimeField(blank=True, help_text="refused from then on", null=True)),
                (
                    "agent",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tokens",
                        to="operations.agent",
                    ),
                ),
            ],
        ),
        migrations.RunPython(move_digests_to_tokens, migrations.RunPython.noop),
        migrations.RemoveField(model_name="agent", name="token_digest"),
        migrations.RunSQL(
            f"""
            CREATE TABLE IF NOT EXISTS "{CACHE_TABLE}" (
                "cache_key" varchar(255) NOT NULL PRIMARY KEY,
                "value" text NOT NULL,
                "expires" timestamp with time zone NOT NULL
            );
            CREATE INDEX IF NOT EXISTS "{CACHE_TABLE}_expires" ON "{CACHE_TABLE}" ("expires");
            """,
            f'DROP TABLE IF EXISTS "{CACHE_TABLE}"',
        ),
    ]
