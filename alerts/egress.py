"""Where a webhook may go (docs/alerts.md, "Webhooks"): the addresses the server posts to.

A rule's URL is written by whoever edits the fleet file, and a webhook is a request the server
makes from inside its own network, so the address it connects to is checked:

- link-local and cloud metadata addresses (169.254.0.0/16 with 169.254.169.254, fe80::/10,
  AWS's fd00:ec2::254) are refused always: they hand out the host's credentials;
- loopback and private addresses (127/8, ::1, 10/8, 172.16/12, 192.168/16, fc00::/7, and the
  unspecified 0.0.0.0/8 and ::, which reach this host) only with
  ``ALERT_WEBHOOK_ALLOW_PRIVATE``.

Checked twice: an address literal when the fleet file is applied (``targets.target_error``),
and every address a host name resolves to when the webhook is sent, on the connection itself
(``guarded_connection``): the socket connects only to an address that was checked, so a name
whose DNS answer changes between the check and the connection gains nothing. Webhooks never go
through an HTTP proxy (its address, not the receiver's, would be the one checked).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.request
from typing import Any

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NETWORKS = ipaddress.IPv4Network | ipaddress.IPv6Network
REFUSED: tuple[_NETWORKS, ...] = tuple(
    ipaddress.ip_network(n) for n in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128")
)
PRIVATE: tuple[_NETWORKS, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "::1/128",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "fc00::/7",
        "0.0.0.0/8",
        "::/128",
    )
)


class AddressRefused(Exception):
    """A webhook's host is (or resolves to) an address it may not be sent to."""


def address_error(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a webhook may not connect to ``address`` ("a … address: …"), or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    if any(address in network for network in REFUSED):
        return "a link-local or cloud metadata address: never a webhook target"
    if not allow_private and any(address in network for network in PRIVATE):
        return (
            "a loopback or private address: set ALERT_WEBHOOK_ALLOW_PRIVATE=1 to send "
            "webhooks inside your network"
        )
    return None


def host_literal(host: str) -> IPAddress | None:
    """The address a host written as a number stands for (``[::1]``, ``127.0.0.1``, and the
    old forms a resolver still accepts: ``127.1``, ``0x7f.0.0.1``, ``2130706433``), or None
    for a name. Reads no DNS."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def host_error(host: str) -> str | None:
    """What is wrong with a webhook's host as written (address literals only; a name is
    checked on what it resolves to when the webhook is sent)."""
    address = host_literal(host)
    if address is None:
        return None
    error = address_error(address, allow_private=settings.ALERT_WEBHOOK_ALLOW_PRIVATE)
    return None if error is None else f"{address} is {error}"


def guarded_connection(
    address: tuple[str, int], timeout: Any = None, source_address: Any = None
) -> socket.socket:
    """``socket.create_connection`` for webhooks: resolve the host, refuse it if any address
    it resolves to is refused (``AddressRefused``), then connect to those addresses only."""
    host, port = address
    found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    allow_private = settings.ALERT_WEBHOOK_ALLOW_PRIVATE
    for *_, sockaddr in found:
        resolved = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        error = address_error(resolved, allow_private=allow_private)
        if error is not None:
            raise AddressRefused(f"{host} resolves to {resolved}, {error}")
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in found:
        sock = socket.socket(family, kind, proto)
        try:
            if isinstance(timeout, int | float):  # not socket's "global default" marker
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"{host}: no address to connect to")


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = guarded_connection


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = guarded_connection  # TLS still verifies the host name


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req)  # the default context: certificates checked


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook is posted to its URL only: a redirect is an answer, not a new address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def webhook_opener() -> urllib.request.OpenerDirector:
    """An opener that follows no redirect, uses no proxy and connects only to checked
    addresses."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _NoRedirect, _HTTPHandler, _HTTPSHandler
    )
