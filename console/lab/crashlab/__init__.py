"""The crash lab: kill real workers at the worst moment and count effects at the provider.

``naive`` holds the control executors (kept only here, to prove the crashes are real);
``runner`` drives the matrix; ``verdict`` judges the rows; ``acceptance`` is the seven-check
gate. Everything runs against the sandbox provider on loopback, never a real provider.
"""
