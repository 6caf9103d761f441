"""Agents' callback URLs: what may be registered, and where the workers may POST.

The workers send an HTTP request to whatever an agent registers: left unchecked, that is a
server-side request forgery (SSRF; OWASP "Server Side Request Forgery Prevention Cheat Sheet")
aimed at the deployment's own network (a database's admin port, a cloud metadata service at
169.254.169.254). Two checks:

* at registration (``callback_url_problem``): an absolute ``http``/``https`` URL with a host,
  no credentials, no fragment, at most ``MAX_URL_CHARS``; a host written as an IP address must
  be allowed (below), and an IPv4 address must be written in dotted-decimal form: a legacy
  form the resolver also reads (``0x0a000001``, ``10.1``, ``167772161``, ``012.0.0.1``;
  ``legacy_ipv4_address``) is refused, after the address it denotes is checked so that the
  message says why. No DNS lookup here: an API request never waits for a resolver.
* at every delivery (``address_problem``): the host's addresses, resolved then, must all be
  allowed: global unicast addresses (``ipaddress``'s ``is_global``: not loopback, private,
  link-local, shared or reserved), or inside ``EFFECT_LEDGER["WEBHOOK_ALLOWED_NETWORKS"]``
  (e.g. ``127.0.0.0/8`` for the quick start and the tests, ``10.20.0.0/16`` for agents on an
  internal network). Redirects are never followed (``operations.notifications.webhook_sender``).

The residual risk is DNS rebinding between the check and the connection; a deployment that
needs more routes the workers' egress through a proxy that enforces the same rule.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

#: Longest URL accepted (characters); browsers and servers commonly cap URLs near 2,000.
MAX_URL_CHARS = 2000

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def allowed_networks() -> list[IPNetwork]:
    """The networks of ``EFFECT_LEDGER["WEBHOOK_ALLOWED_NETWORKS"]`` (a list of CIDR strings)
    beyond the global addresses every callback may reach."""
    return [
        ipaddress.ip_network(str(n).strip(), strict=False)
        for n in settings.EFFECT_LEDGER["WEBHOOK_ALLOWED_NETWORKS"]
    ]


#: IPv6 prefixes whose last 32 bits carry an IPv4 address a network may route to: NAT64's
#: well-known prefix (RFC 6052 section 2.1), IPv4-translated (RFC 2765 section 2.1) and the
#: deprecated IPv4-compatible form (RFC 4291 section 2.5.5.1).
_IPV4_IN_LAST_32_BITS = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("64:ff9b::/96", "::ffff:0:0:0/96", "::/96")
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, or None: IPv4-mapped (``::ffff:a.b.c.d``),
    6to4 (``2002:AABB:CCDD::``, RFC 3056), or one of ``_IPV4_IN_LAST_32_BITS``; so
    ``[64:ff9b::a9fe:a9fe]`` is judged as 169.254.169.254 (a reviewer's NAT64 form of the cloud
    metadata address). ``::`` and ``::1`` carry none (they are judged as themselves)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if int(address) > 1 and any(address in network for network in _IPV4_IN_LAST_32_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_allowed(address: IPAddress) -> bool:
    """Whether the workers may POST to ``address``: a global address, or one inside an allowed
    network. An IPv6 address carrying an IPv4 one (``embedded_ipv4``) is judged as that IPv4
    address."""
    if isinstance(address, ipaddress.IPv6Address):
        address = embedded_ipv4(address) or address
    if any(address in network for network in allowed_networks()):
        return True
    return address.is_global and not address.is_multicast


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


#: The characters of an IPv4 address in any form ``inet_aton`` reads (hostnames are lowercased).
_INET_ATON_CHARS = frozenset("0123456789abcdefx.")


def legacy_ipv4_address(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` denotes in a legacy form, or None: a form the resolver
    (``getaddrinfo``, through ``inet_aton``) reads as an address although it is not the
    dotted-decimal ``IPv4address`` of RFC 3986 section 3.2.2: hexadecimal or octal parts
    (``0x0a000001``, ``012.0.0.1``), fewer than four parts (``10.1``), one number
    (``167772161``), a trailing dot (``10.0.0.1.``), or digits that IDNA maps to ASCII ones
    (fullwidth ``１０.０.０.１``; Python's socket module IDNA-encodes a host before resolving).
    RFC 3986 section 7.4 ("Rare IP Address Formats") warns that such forms reach addresses a
    check of the usual form misses. A plain dotted quad gives None (``ipaddress`` reads it), and
    so does every DNS name: none of these forms is one anybody can register (top-level domains
    are alphabetic)."""
    if _literal_address(host) is not None:
        return None
    candidate = host
    if not candidate.isascii():
        try:
            candidate = candidate.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    candidate = candidate.lower().removesuffix(".")
    if not candidate or not set(candidate) <= _INET_ATON_CHARS:
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(candidate))
    except OSError:
        return None


def callback_url_problem(url: str) -> str:
    """Why ``url`` cannot be an agent's callback URL, or ``""`` when it can (see the module's
    rules). The message is shown to the agent (a 422 problem) and to the admin."""
    if len(url) > MAX_URL_CHARS:
        return f"the URL is longer than {MAX_URL_CHARS} characters"
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return "the URL contains whitespace or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"the URL is malformed: {exc}"
    if parts.scheme not in {"http", "https"}:
        return "the URL must start with https:// (or http://)"
    if not parts.hostname:
        return "the URL names no host"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "the URL must not carry credentials (user:password@): the request is signed instead"
    if parts.fragment or "#" in url:
        return "the URL must not have a fragment (#...): it is never sent to the server"
    if port == 0:
        return "the URL's port must be 1-65535"
    if "%" in parts.netloc:
        return "the URL's host must not be percent-encoded (%..): write it plainly"
    legacy = legacy_ipv4_address(parts.hostname)
    address = legacy or _literal_address(parts.hostname)
    if address is not None and not address_allowed(address):
        written = f" (written {parts.hostname})" if legacy else ""
        return (
            f"the workers may not POST to {address}{written}: not a public address, and not in "
            "EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS"
        )
    if legacy is not None:
        return f"write the IPv4 address {parts.hostname} in dotted-decimal form: {legacy}"
    return ""


def address_problem(url: str) -> str:
    """Why the workers must not POST to ``url`` now, or ``""``: every address its host resolves
    to (``getaddrinfo``) must be allowed (``address_allowed``). Resolution errors are problems."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        infos = socket.getaddrinfo(
            host, parts.port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM
        )
    except OSError as exc:
        return f"cannot resolve {host}: {exc}"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address_allowed(address):
            return f"{host} resolves to {address}: not a public address, and not in EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS"
    return ""
