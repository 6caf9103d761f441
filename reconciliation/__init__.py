"""Reconciliation: resolve UNKNOWN outcomes, take over expired leases, expire approvals."""
