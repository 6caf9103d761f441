"""SIGTERM as an orderly exit for the crash lab (issue 35).

Every mode of ``manage.py crashlab`` starts processes and builds state outside itself: a sandbox
provider, Celery workers and beat (each in a session of its own, so a signal to the command does
not reach them), a RabbitMQ queue, network namespaces and ``socat`` forwarders (the partition
drill), private PostgreSQL servers (the failover drill). Each mode tears them down in a
``finally`` or ``__exit__``; Python's default SIGTERM action ends the process without running
any of them. ``terminate_as_exit`` turns SIGTERM into ``SystemExit(143)`` (128 + 15, the status
a shell reports for a process ended by SIGTERM), so the teardown runs and the command still exits
143.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

#: The exit status after SIGTERM: 128 + the signal's number (the shell's convention).
TERMINATED_STATUS = 128 + signal.SIGTERM


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """While inside, the first SIGTERM raises ``SystemExit(143)`` in the main thread, so every
    ``finally`` and ``__exit__`` between it and this block runs; a later SIGTERM is ignored until
    the block is left, so a second signal cannot cut that teardown short. The previous handler
    is put back on leaving. Does nothing off the main thread (only it may set signal handlers,
    ``signal.signal``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown runs once, to its end
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
