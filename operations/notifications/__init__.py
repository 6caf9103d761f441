"""What leaves the ledger to tell someone: agents' signed webhooks (and which callback URLs
are allowed) and notices to approvers and operators (their text and channels)."""
