"""The acceptance gate's watch on the network and on credentials: connections to anything but
loopback, and reads of credential files, in this process and in the cluster's processes.
"""

from __future__ import annotations

import os
from typing import Any

#: Paths (or parts of them) whose opening counts as a credential read.
CREDENTIAL_PATHS = (
    ".ssh",
    ".aws",
    ".netrc",
    ".pgpass",
    ".docker/config.json",
    "/etc/shadow",
    ".config/gcloud",
)


class NetworkWatch:
    """Counts connections to anything but loopback or a Unix socket, and reads of credential
    files: in this process through an audit hook (PEP 578), in the cluster's processes by
    sampling their sockets with psutil."""

    def __init__(self) -> None:
        self.non_loopback: list[str] = []
        self.credential_reads: list[str] = []
        self.active = False

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit hook (``sys.addaudithook``): record ``socket.connect`` to a non-loopback
        address and ``open`` of a path containing one of ``CREDENTIAL_PATHS``, while ``active``."""
        if not self.active:
            return
        if event == "socket.connect" and len(args) > 1:
            self._address(args[1])
        elif event == "open" and args and isinstance(args[0], str | bytes):
            path = os.fsdecode(args[0])
            if any(marker in path for marker in CREDENTIAL_PATHS):
                self.credential_reads.append(path)

    def _address(self, address: Any) -> None:
        if isinstance(address, tuple) and address:
            host = str(address[0])
            if not (host.startswith("127.") or host in {"::1", "localhost"}):
                self.non_loopback.append(host)

    def sample(self, pids: list[int]) -> None:
        """Record non-loopback remote addresses of the given processes' sockets."""
        import psutil

        for pid in pids:
            try:
                connections = psutil.Process(pid).net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            for conn in connections:
                if conn.raddr:
                    self._address((conn.raddr.ip, conn.raddr.port))
