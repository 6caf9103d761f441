"""The archive's lease while a run lasts (``ArchiveLeaseKeeper``): one archiver at a time on any
host, and a run killed outright blocks the next for at most ``LEASE_SECONDS``."""

from __future__ import annotations

import threading

from django.db import DatabaseError, connection

from operations.services.leases import HeldLease, lease_renew, lease_try_acquire

#: The lease one archiver holds for its run (``operations.services.leases``).
ARCHIVE_LEASE = "archive"

#: Seconds the lease lasts without renewal. A thread renews it every third of that while the run
#: lasts (its own database connection: the run's may be inside a long read-only snapshot), so a
#: run killed with ``kill -9`` holds it at most this long, and the next run may start then.
LEASE_SECONDS = 60.0


def archive_lease_try_acquire() -> HeldLease | None:
    """The archive lease for ``LEASE_SECONDS``, or None when another archiver holds it."""
    return lease_try_acquire(name=ARCHIVE_LEASE, ttl_seconds=LEASE_SECONDS)


class ArchiveLeaseLostError(Exception):
    """The lease expired and another archiver took it over: this run stopped where it was
    (everything it committed stands; the other run finishes the rest)."""


class ArchiveLeaseKeeper(threading.Thread):
    """Renews the run's lease every ``LEASE_SECONDS / 3`` on its own connection until stopped;
    ``check()`` (called by the run between steps) raises once a renewal found it lost."""

    def __init__(self, lease: HeldLease) -> None:
        super().__init__(name="archive-lease", daemon=True)
        self.lease, self.lost, self.stopping = lease, False, threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.wait(LEASE_SECONDS / 3):
                if not lease_renew(self.lease, ttl_seconds=LEASE_SECONDS):
                    self.lost = True
                    return
        except DatabaseError:
            self.lost = True  # unreachable for a whole period: another run may take over
        finally:
            connection.close()

    def check(self) -> None:
        if self.lost:
            raise ArchiveLeaseLostError("the archive lease expired and was taken over: this run stopped")

    def stop(self) -> None:
        self.stopping.set()
        self.join()
