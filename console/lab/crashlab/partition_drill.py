"""The partition drill's network (issue 35, case C28): worker processes in their own network
namespaces, each service they use (PostgreSQL, the broker, the sandbox provider) reached over a
path of its own that the drill can cut and heal while the others stay up.

Built only from the kernel's and Debian's tools, run as root: ``ip netns`` (a namespace per
worker), ``ip link ... type veth`` (one pair per path, each on a private /30 of
``10.231.<n>.0/24``, loopback-only: nothing routes it anywhere), and ``socat`` on the host side
forwarding ``<host end of the pair>:<port>`` to the service on ``127.0.0.1:<port>`` (PostgreSQL,
RabbitMQ and the sandbox listen on loopback only). Inside a namespace, the service is at the host
end's address and the same port.

* ``cut(ns, service)``: ``ip link set <namespace end> down``. The kernel drops the path's route
  in the namespace: packets of open connections are not delivered (TCP retransmits, the
  application waits, as across a real partition), new connections fail at once.
* ``heal(ns, service)``: the link up again; the route is back and TCP's next retransmission
  goes through.
* ``drop_connections(ns, service)``: restart the path's forwarder, so the service sees the
  connections through it end (as RabbitMQ does when a partitioned client's heartbeats stop,
  only sooner); the client learns it when the path heals (its next packet is reset).

Everything is torn down on every exit path (``close``, also from ``__exit__`` after a failure):
forwarders killed by process group, namespaces and host ends of the pairs deleted.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from types import TracebackType

#: The private /16 the drill carves its /30s from (RFC 1918; never routed off this machine).
PREFIX = "10.231"
RTO_MAX = "/proc/sys/net/ipv4/tcp_rto_max_ms"


class PartitionUnavailable(RuntimeError):
    """The machine cannot run the drill (not root, no ``ip netns``, no ``socat``)."""


def unavailable_reason() -> str | None:
    """Why the drill cannot run here, or None when it can.

    Checks: root (network namespaces and veth pairs need ``CAP_NET_ADMIN``), ``ip`` and
    ``socat`` on the PATH, and that ``ip netns add`` works (a container may forbid it).
    """
    if os.geteuid() != 0:
        return "the partition drill needs root (ip netns, veth pairs)"
    for tool in ("ip", "socat"):
        if shutil.which(tool) is None:
            return f"the partition drill needs {tool!r} on the PATH"
    probe = f"elp-probe-{uuid.uuid4().hex[:6]}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode:
            return f"'ip netns add' failed: {(made.stderr or made.stdout).strip()}"
    finally:  # also when SIGTERM (as SystemExit) lands between the two
        _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``.

    Raises:
        PartitionUnavailable: ``check`` and ``ip`` failed (the message carries its stderr).
    """
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)  # noqa: S603, S607
    if check and done.returncode:
        raise PartitionUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Path:
    """One cuttable path: a veth pair between the host and a namespace, and its forwarder.

    Attributes:
        host_if, ns_if: the pair's interface names (host end, namespace end).
        host_addr, ns_addr: their addresses on the path's /30.
        port: the service's TCP port on 127.0.0.1, and the forwarder's on ``host_addr``.
    """

    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str
    port: int
    forwarder: subprocess.Popen[bytes] | None = None
    up: bool = True


@dataclass
class Namespace:
    """A network namespace and its paths by service name."""

    name: str
    paths: dict[str, Path] = field(default_factory=dict)


class PartitionNet:
    """Namespaces whose every service path can be cut on its own. A context manager: leaving
    it (normally or by an exception) tears everything down.

    Args:
        services: service name -> its TCP port on 127.0.0.1 (e.g. ``{"db": 5432, "broker":
            5672, "provider": 38123}``); every namespace gets one path per service.
        rto_max_ms: the namespaces' ``net.ipv4.tcp_rto_max_ms`` (milliseconds, the kernel takes
            1000..120000), where the kernel has it: after a heal, a connection's next
            retransmission comes within this bound instead of TCP's exponential backoff (up to
            120 s), so the drill knows when a late write lands.

    Raises:
        ValueError: no services, or a port outside 1..65535.
    """

    def __init__(self, services: dict[str, int], *, rto_max_ms: int = 1000) -> None:
        if not services:
            raise ValueError("the partition drill needs at least one service to forward")
        for name, port in services.items():
            if not 0 < int(port) < 65536:
                raise ValueError(f"service {name!r}: port {port!r} is not a TCP port")
        self.services = dict(services)
        self.rto_max_ms = rto_max_ms
        #: Whether the namespaces cap TCP's retransmission backoff (``tcp_rto_max_ms``, Linux
        #: 6.15+); without it a healed path may stay silent for many seconds more.
        self.capped_backoff = os.path.exists(RTO_MAX)
        self.tag = uuid.uuid4().hex[:4]
        self.subnet = _free_subnet()
        self.namespaces: dict[str, Namespace] = {}
        self._next_slot = 0

    def __enter__(self) -> PartitionNet:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- building --------------------------------------------------------------------------------

    def add_namespace(self, label: str) -> Namespace:
        """Create namespace ``elp-<tag>-<label>`` with one path per service (veth pair, /30,
        forwarder) and loopback up; return it.

        Raises:
            PartitionUnavailable: ``ip`` refused, or no /30 is left in the drill's /24.
            ValueError: ``label`` is not 1-6 letters or digits, or already used.
        """
        if not (label.isalnum() and 0 < len(label) <= 6) or label in self.namespaces:
            raise ValueError(f"namespace label {label!r}: 1-6 letters or digits, once each")
        ns = Namespace(name=f"elp-{self.tag}-{label}")
        self.namespaces[label] = ns  # registered first: close() deletes it whatever fails next
        _ip("netns", "add", ns.name)
        _ip("-n", ns.name, "link", "set", "lo", "up")
        if self.capped_backoff:
            # /proc/sys/net is the namespace's own for a process inside it.
            subprocess.run(  # noqa: S603, S607 - fixed command, our own namespace
                ["ip", "netns", "exec", ns.name, "sh", "-c", f"echo {int(self.rto_max_ms)} > {RTO_MAX}"],
                check=True,
                capture_output=True,
            )
        for service, port in self.services.items():
            self._add_path(ns, service, port)
        return ns

    def _add_path(self, ns: Namespace, service: str, port: int) -> None:
        if self._next_slot >= 64:
            raise PartitionUnavailable("the drill's /24 has no /30 left")
        base = self._next_slot * 4
        self._next_slot += 1
        name = f"elp{self.tag}{self._next_slot:02d}"  # at most 15 characters with its suffix
        path = Path(
            host_if=f"{name}h",
            ns_if=f"{name}n",
            host_addr=f"{self.subnet}.{base + 1}",
            ns_addr=f"{self.subnet}.{base + 2}",
            port=port,
        )
        ns.paths[service] = path  # registered first: close() deletes it whatever fails next
        _ip("link", "add", path.host_if, "type", "veth", "peer", "name", path.ns_if)
        _ip("link", "set", path.ns_if, "netns", ns.name)
        _ip("addr", "add", f"{path.host_addr}/30", "dev", path.host_if)
        _ip("link", "set", path.host_if, "up")
        _ip("-n", ns.name, "addr", "add", f"{path.ns_addr}/30", "dev", path.ns_if)
        _ip("-n", ns.name, "link", "set", path.ns_if, "up")
        path.forwarder = _forward(path)

    # --- using ----------------------------------------------------------------------------------

    def address(self, label: str, service: str) -> tuple[str, int]:
        """Where ``service`` is reached from inside namespace ``label``: ``(host, port)``.

        Raises:
            KeyError: an unknown namespace label or service.
        """
        path = self.namespaces[label].paths[service]
        return path.host_addr, path.port

    def command(self, label: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``label`` (``ip netns exec``, which execs it: the pid
        is the program's own)."""
        return ["ip", "netns", "exec", self.namespaces[label].name, *argv]

    def cut(self, label: str, service: str) -> None:
        """Cut the path from namespace ``label`` to ``service`` (its namespace end down)."""
        ns = self.namespaces[label]
        _ip("-n", ns.name, "link", "set", ns.paths[service].ns_if, "down")
        ns.paths[service].up = False

    def heal(self, label: str, service: str) -> None:
        """Heal the path from namespace ``label`` to ``service`` (link up, its route back)."""
        ns = self.namespaces[label]
        path = ns.paths[service]
        _ip("-n", ns.name, "link", "set", path.ns_if, "up")
        # The kernel re-adds the /30's route once the link is up again; the address stays.
        path.up = True

    def drop_connections(self, label: str, service: str) -> None:
        """End every connection through this path at the service's side: its forwarder (and
        the children serving each connection) killed, a fresh one listening."""
        path = self.namespaces[label].paths[service]
        _stop(path.forwarder)
        path.forwarder = _forward(path)

    # --- tearing down ----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every forwarder, delete every veth pair (by its host end, which deletes both)
        and namespace. Safe to call twice, and after a half-built namespace."""
        for ns in self.namespaces.values():
            for path in ns.paths.values():
                _stop(path.forwarder)
                path.forwarder = None
                _ip("link", "del", path.host_if, check=False)
            _ip("netns", "del", ns.name, check=False)
        self.namespaces.clear()


def _forward(path: Path) -> subprocess.Popen[bytes]:
    """``socat`` listening on ``host_addr:port``, one child per connection to 127.0.0.1:port,
    in a session of its own (killed as a group); returned once it listens.

    Raises:
        PartitionUnavailable: it exited or did not listen within 5 seconds.
    """
    process = subprocess.Popen(  # noqa: S603 - fixed tool, our own addresses
        [
            "socat",
            f"TCP-LISTEN:{path.port},bind={path.host_addr},reuseaddr,fork",
            f"TCP:127.0.0.1:{path.port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 5
    while not _listening(path):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            raise PartitionUnavailable(f"socat did not listen on {path.host_addr}:{path.port}")
        time.sleep(0.02)
    return process


def _listening(path: Path) -> bool:
    done = subprocess.run(  # noqa: S603, S607 - iproute2's ss, fixed arguments
        ["ss", "-Hltn", "src", f"{path.host_addr}:{path.port}"], capture_output=True, text=True, check=False
    )
    return bool(done.stdout.strip())


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def _free_subnet() -> str:
    """A ``10.231.<n>`` /24 no interface on this machine has an address in (another drill's)."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout
    free = [n for n in range(1, 255) if f" {PREFIX}.{n}." not in used]
    if not free:
        raise PartitionUnavailable(f"every {PREFIX}.<n>.0/24 is in use on this machine")
    return f"{PREFIX}.{random.choice(free)}"  # noqa: S311 - a spread, not a secret
