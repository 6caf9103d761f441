"""A loopback TCP proxy that a test can cut and restore, to take a server "down" for the
processes that reach it through the proxy while everything else keeps its direct connection.

``cut()`` closes every proxied connection (both ends) and stops listening, so new connections
are refused (ECONNREFUSED), the way a stopped PostgreSQL looks to its clients. ``restore()``
listens again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``, one thread per direction.

    Attributes:
        port: the local port (chosen by the kernel at ``start``, kept across cuts).
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()

    def start(self) -> TcpProxy:
        """Listen (on a free port the first time, the same port after a cut)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._cut.clear()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Refuse new connections and close every open one, at once."""
        self._cut.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            self._close(sock)

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self.start()

    def stop(self) -> None:
        """Cut for good (end of the test)."""
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while not self._cut.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed by cut()
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                self._close(client)
                continue
            with self._lock:
                if self._cut.is_set():
                    self._close(client)
                    self._close(server)
                    return
                self._sockets.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            pass
        self._close(source)
        self._close(target)
        with self._lock:
            self._sockets.discard(source)
            self._sockets.discard(target)

    @staticmethod
    def _close(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()
