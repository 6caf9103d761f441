"""The ledger: models, state-machine services, idempotency, adapters, execution tasks and the API."""
