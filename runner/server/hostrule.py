"""Ollama's Host rule against DNS rebinding (server/routes.go ``allowedHostsMiddleware``), exactly.

A page on ``evil.example`` whose name the attacker makes resolve to 127.0.0.1 is, to the browser,
same-origin with a server on 127.0.0.1; only the ``Host`` header it sends (``evil.example``)
gives it away. So, when the server listens on a loopback address, a request's ``Host`` must name
this machine or a local network:

1. The host is the ``Host`` header without its port, split as Go's ``net.SplitHostPort`` does
   (``[::1]:80`` gives ``::1``); a header it cannot split is taken whole (``localhost``, ``::1``,
   but also ``[::1]``, which then names nothing allowed).
2. An IP literal (Go's ``netip.ParseAddr``) passes when it is loopback (``127/8``, ``::1``),
   private (``10/8``, ``172.16/12``, ``192.168/16``, ``fc00::/7``; IPv4-mapped IPv6 counts as its
   IPv4), unspecified (``0.0.0.0``, ``::``) or one of this machine's interface addresses.
3. A name (lowercased) passes when it is empty, ``localhost``, this machine's hostname, or ends in
   ``.localhost``, ``.local`` or ``.internal``.

Anything else is refused (403). A server listening on any other address (``0.0.0.0``, a LAN IP)
was made reachable on purpose: no Host check at all.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import logging
import socket
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable

log = logging.getLogger("runner.server")

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def split_host_port(hostport: str) -> tuple[str, str] | None:
    """Go's ``net.SplitHostPort``: (host, port), or None where Go returns an error."""
    i = hostport.rfind(":")
    if i < 0:
        return None  # missing port
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or end + 1 != i:
            return None  # missing ']', missing port, or too many colons
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            return None  # too many colons
    if "[" in hostport[j:] or "]" in hostport[k:]:
        return None
    return host, hostport[i + 1:]


def parse_ip(text: str) -> IP | None:
    """Go's ``netip.ParseAddr``: dotted-quad IPv4 (no leading zeros) or IPv6 (a ``%zone`` allowed)."""
    if not text.isascii():
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _unmap(ip: IP) -> IP:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback(ip: IP) -> bool:
    """``netip.Addr.IsLoopback``: 127/8 (also IPv4-mapped) or ::1 (whatever its zone)."""
    ip = _unmap(ip)
    return ip.packed[0] == 127 if ip.version == 4 else int(ip) == 1


def is_private(ip: IP) -> bool:
    """``netip.Addr.IsPrivate``: RFC 1918 (also IPv4-mapped) or RFC 4193 ``fc00::/7``."""
    ip = _unmap(ip)
    a, b = ip.packed[0], ip.packed[1]
    if ip.version == 4:
        return a == 10 or (a == 172 and b & 0xF0 == 16) or (a == 192 and b == 168)
    return a & 0xFE == 0xFC


def is_unspecified(ip: IP) -> bool:
    """``netip.Addr.IsUnspecified``: exactly ``0.0.0.0`` or ``::`` (no zone; a mapped one is not)."""
    if isinstance(ip, ipaddress.IPv6Address):
        return int(ip) == 0 and ip.scope_id is None
    return int(ip) == 0


def is_local_ip(ip: IP, interface_ips: Iterable[IP]) -> bool:
    """Ollama's ``isLocalIP``: the address prints as one of this machine's interface addresses.

    Go compares ``netip`` text with ``net.IP`` text, so an address with a zone, or an IPv4-mapped
    IPv6 one (``::ffff:a.b.c.d``, which ``net.IP`` would print as ``a.b.c.d``), never matches."""
    if isinstance(ip, ipaddress.IPv6Address) and (ip.scope_id is not None or ip.ipv4_mapped is not None):
        return False
    return any(_unmap(own) == ip for own in interface_ips)


def allowed_name(host: str, hostname: str) -> bool:
    """Ollama's ``allowedHost``: empty, ``localhost``, the machine's hostname, or a local suffix."""
    host = host.lower()
    if host in ("", "localhost") or host == hostname.lower():
        return True
    return host.endswith(LOCAL_SUFFIXES)


# ------------------------------------------------------------------------ interface addresses
class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_IfAddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.c_void_p),
    ("ifa_netmask", ctypes.c_void_p),
    ("ifa_ifu", ctypes.c_void_p),
    ("ifa_data", ctypes.c_void_p),
]


def _family(sockaddr: int) -> int:
    # Linux: a 16-bit sa_family first; the BSDs and macOS: an 8-bit sa_len, then an 8-bit family
    if sys.platform.startswith("linux"):
        return ctypes.c_ushort.from_address(sockaddr).value
    return ctypes.c_ubyte.from_address(sockaddr + 1).value


def interface_addresses() -> list[IP]:
    """This machine's interface addresses (libc ``getifaddrs``, what Go's ``net.Interfaces``
    lists), without zones; empty where they cannot be read (then only the other rules apply)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        getifaddrs, freeifaddrs = libc.getifaddrs, libc.freeifaddrs
    except (OSError, AttributeError):
        return []
    getifaddrs.argtypes = [ctypes.POINTER(ctypes.POINTER(_IfAddrs))]
    freeifaddrs.argtypes = [ctypes.POINTER(_IfAddrs)]
    head = ctypes.POINTER(_IfAddrs)()
    if getifaddrs(ctypes.byref(head)) != 0:
        log.debug("getifaddrs failed: only loopback, private and unspecified IPs pass the Host check")
        return []
    out: list[IP] = []
    try:
        node = head
        while node:
            sockaddr = node.contents.ifa_addr
            if sockaddr:
                family = _family(sockaddr)
                if family == socket.AF_INET:
                    out.append(ipaddress.IPv4Address(ctypes.string_at(sockaddr + 4, 4)))
                elif family == socket.AF_INET6:
                    out.append(ipaddress.IPv6Address(ctypes.string_at(sockaddr + 8, 16)))
            node = node.contents.ifa_next
    finally:
        freeifaddrs(head)
    return out


class Verdict(Enum):
    """What the rule says about one request."""

    UNCHECKED = "unchecked"  # the server does not listen on loopback: no rule
    IP = "ip"                # an allowed IP literal: the request goes on
    NAME = "name"            # an allowed name: the request goes on, but an OPTIONS one ends in 204
    REFUSED = "refused"      # 403


def listens_on_loopback(bind_host: str) -> bool:
    """Whether binding ``bind_host`` (OLLAMA_HOST's host) listens on a loopback address (the
    listener's address is what Ollama tests); a name is resolved as the bind would resolve it."""
    name = bind_host.lower().strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    ip = parse_ip(name)
    if ip is None:
        try:
            ip = parse_ip(socket.gethostbyname(name))
        except OSError:
            return True  # cannot tell (the bind will fail anyway): the strict answer
    return ip is not None and is_loopback(ip)


@dataclass(frozen=True)
class Hosts:
    """The Host rule of a server; ``checked`` is whether it listens on loopback. ``hostname`` and
    ``interface_ips`` are read per request, as Ollama reads them (a test may pass its own)."""

    checked: bool
    hostname: Callable[[], str] = field(default=socket.gethostname, compare=False)
    interface_ips: Callable[[], list[IP]] = field(default=interface_addresses, compare=False)

    @classmethod
    def of(cls, bind_host: str) -> Hosts:
        return cls(listens_on_loopback(bind_host))

    def verdict(self, header: str) -> Verdict:
        """The verdict for a request whose ``Host`` header is ``header`` ("" when it has none)."""
        if not self.checked:
            return Verdict.UNCHECKED
        split = split_host_port(header)
        host = split[0] if split is not None else header
        ip = parse_ip(host)
        if ip is not None and (is_loopback(ip) or is_private(ip) or is_unspecified(ip)
                               or is_local_ip(ip, self.interface_ips())):
            return Verdict.IP
        try:
            hostname = self.hostname()
        except OSError:
            hostname = ""
        return Verdict.NAME if allowed_name(host, hostname) else Verdict.REFUSED

    def allows(self, header: str) -> bool:
        return self.verdict(header) is not Verdict.REFUSED
