"""Tell listeners when an intent's status changes (issue 15, "Waiting without polling").

An ``AFTER UPDATE OF status`` row trigger on ``operations_intent`` sends
``pg_notify('effect_ledger_intent_status', <intent id>)`` when the status really changed
(``OLD.status IS DISTINCT FROM NEW.status``). PostgreSQL delivers a notification only when the
transaction that sent it commits, so a listener never hears of a change it cannot yet read
(PostgreSQL docs, "NOTIFY"). ``operations.waiting`` listens on the channel so that
``GET /api/v1/intents/{id}?wait=SECONDS`` answers as soon as the status moves.

Every transition goes through ``transitions.transition`` (an ``UPDATE ... SET status``), and the
reconciler's batch updates set ``status`` too: the trigger sees them all, whatever wrote them.

Cost: one notification per changed row, queued in memory until commit; at commit PostgreSQL
takes a lock for the whole server and holds it until the commit is flushed, so that the queue is
in commit order (``src/backend/commands/async.c``, ``PreCommit_Notify``): transactions that
change a status commit one at a time (README, "Waiting for an outcome", has the measured cost).
"""

from django.db import migrations

#: The channel; ``operations.waiting.CHANNEL`` names the same.
CHANNEL = "effect_ledger_intent_status"

CREATE = f"""
CREATE FUNCTION operations_intent_status_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', NEW.id::text);
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

    operations = [migrations.RunSQL(CREATE, DROP)]
