"""Tell waiting requests when an intent's status changes (issue 15, "Waiting without polling").

An ``AFTER UPDATE OF status`` row trigger on ``operations_intent`` sends
``pg_notify('effect_ledger_intent_status', <intent id>)`` when the status really changed
(``OLD.status IS DISTINCT FROM NEW.status``) **and a request waits for that intent** (a row in
``operations_intentwaiter``, written by ``operations.waiting`` for the length of one wait).
PostgreSQL delivers a notification only when the transaction that sent it commits, so a listener
never hears of a change it cannot yet read (PostgreSQL docs, "NOTIFY").

Every transition goes through ``transitions.transition`` (an ``UPDATE ... SET status``), and the
reconciler's batch updates set ``status`` too: the trigger sees them all, whatever wrote them.

Why only for awaited intents: at commit, a transaction that notified takes a lock for the whole
server and holds it until its commit is flushed, so that the queue is in commit order
(``src/backend/commands/async.c``, ``PreCommit_Notify``): transactions that notify commit one at
a time. Notifying on every status change halved the commits per second of four concurrent
writers here (README, "Waiting for an outcome"); an intent nobody waits for now costs one probe
of a near-empty index. The waiter table is UNLOGGED (no WAL; emptied after a crash, when no
request waits any more).
"""

from django.db import migrations, models

#: The channel; ``operations.waiting.CHANNEL`` names the same.
CHANNEL = "effect_ledger_intent_status"

CREATE = f"""
ALTER TABLE operations_intentwaiter SET UNLOGGED;

CREATE FUNCTION operations_intent_status_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A statement of its own, with its own snapshot (READ COMMITTED): a waiter that registered
    -- and committed before this UPDATE took the row lock is seen (operations.waiting).
    IF EXISTS (SELECT 1 FROM operations_intentwaiter WHERE intent_id = NEW.id) THEN
        PERFORM pg_notify('{CHANNEL}', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER intent_status_notify
AFTER UPDATE OF status ON operations_intent
FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION operations_intent_status_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS intent_status_notify ON operations_intent;
DROP FUNCTION IF EXISTS operations_intent_status_notify();
"""


class Migration(migrations.Migration):
    dependencies = [("operations", "0027_notifications")]

    operations = [
        migrations.CreateModel(
            name="IntentWaiter",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("intent_id", models.UUIDField(db_index=True)),
                ("expires_at", models.DateTimeField(db_index=True)),
            ],
        ),
        migrations.RunSQL(CREATE, DROP),
    ]
