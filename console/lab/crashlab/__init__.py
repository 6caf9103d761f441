"""The crash lab: kill real workers at the worst moment and count effects at the provider.

``naive`` holds the control executors (kept only here, to prove the crashes are real);
``runner`` drives the matrix; ``verdict`` judges the rows; ``acceptance`` is the gate (seven
checks and the restore drill); ``duplicate_drill``, ``restore_drill`` and ``failover_drill``
(on a private primary and streaming replica, ``replica_pair``) are the drills. Everything runs
against the sandbox provider on loopback, never a real provider.
"""
