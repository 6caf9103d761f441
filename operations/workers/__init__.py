"""What keeps the Celery workers fed and known: the transactional outbox, delivery timing
when the broker or database is away, worker heartbeats and worker signals."""
