"""A database that went back in time (issue 22): the check that detects it and the recovery
that pauses and repairs."""
