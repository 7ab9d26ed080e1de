"""Ollama's Host rule (runner/server/hostrule.py), case by case.

Ollama's own tests (server/routes_test.go) hold no case for ``allowedHost`` or
``allowedHostsMiddleware``, so this table is read off the Go code: ``net.SplitHostPort`` on the
header (the whole header where it fails), ``netip.ParseAddr`` then ``IsLoopback``/``IsPrivate``/
``IsUnspecified``/``isLocalIP``, then ``allowedHost`` on the lowercased name. The machine's
hostname and interface addresses are fixed here; the last tests read the real ones.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

from runner.server.hostrule import (Hosts, Verdict, interface_addresses, listens_on_loopback, parse_ip,
                                    split_host_port)

OWN_IPS = [ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "203.0.113.7", "2001:db8::7", "fe80::1")]
HOSTS = Hosts(True, hostname=lambda: "MyBox", interface_ips=lambda: OWN_IPS)

IP, NAME, REFUSED = Verdict.IP, Verdict.NAME, Verdict.REFUSED
TABLE = [
    # names: empty, localhost, the hostname, *.localhost, *.local, *.internal; any case, any port
    ("", NAME), (":11434", NAME), ("localhost", NAME), ("localhost:11434", NAME), ("LocalHost:80", NAME),
    ("localhost:", NAME), ("[localhost]:80", NAME), ("app.localhost", NAME), ("a.b.localhost:8080", NAME),
    ("myhost.local", NAME), ("MyHost.Local:11434", NAME), ("printer.local", NAME), (".local", NAME),
    ("db.internal", NAME), ("x.y.internal:1", NAME), ("host.docker.internal:11434", NAME),
    ("mybox", NAME), ("MYBOX:11434", NAME),
    # loopback IPs
    ("127.0.0.1", IP), ("127.0.0.1:11434", IP), ("127.9.8.7:1", IP), ("[::1]:11434", IP), ("::1", IP),
    ("[::ffff:127.0.0.1]:80", IP), ("[::1%lo]:80", IP),
    # private IPs (RFC 1918, RFC 4193), IPv4-mapped too
    ("10.0.0.1:11434", IP), ("172.16.0.1", IP), ("172.31.255.255", IP), ("192.168.1.10", IP),
    ("[fd00::1]:80", IP), ("[fc00::1]:80", IP), ("[::ffff:10.1.2.3]:1", IP),
    # unspecified IPs, exactly
    ("0.0.0.0", IP), ("0.0.0.0:11434", IP), ("[::]:11434", IP),
    # this machine's own interface addresses, as Go prints them
    ("203.0.113.7", IP), ("203.0.113.7:11434", IP), ("[2001:db8::7]:80", IP), ("[fe80::1]:80", IP),
    ("[fe80::1%eth0]:80", REFUSED), ("[::ffff:203.0.113.7]:1", REFUSED),
    # other IPs
    ("203.0.113.8", REFUSED), ("8.8.8.8:53", REFUSED), ("172.32.0.1", REFUSED), ("169.254.1.1", REFUSED),
    ("100.64.0.1", REFUSED), ("[2001:db8::8]:80", REFUSED), ("[::ffff:0.0.0.0]:1", REFUSED),
    ("[fe00::1]:80", REFUSED), ("127.0.0.01", REFUSED), ("127.1", REFUSED),
    # a bracketed IPv6 without a port does not split, and "[::1]" whole is no IP and no name
    ("[::1]", REFUSED), ("[fd00::1]", REFUSED),
    # other names: what a rebinding page sends
    ("evil.example", REFUSED), ("evil.example:11434", REFUSED), ("localhost.evil.example", REFUSED),
    ("evillocalhost", REFUSED), ("127.0.0.1.nip.io", REFUSED), ("printer.local.evil.example", REFUSED),
    ("mybox.evil.example", REFUSED), ("localhost.", REFUSED), ("local", REFUSED), ("internal", REFUSED),
    ("a:b:c", REFUSED), ("localhost:80:90", REFUSED), ("[localhost:80", REFUSED),
]


@pytest.mark.parametrize("header, verdict", TABLE)
def test_ollama_host_rule(header, verdict):
    assert HOSTS.verdict(header) is verdict
    assert HOSTS.allows(header) is (verdict is not REFUSED)


def test_no_rule_off_loopback():
    hosts = Hosts(False, hostname=lambda: "mybox", interface_ips=lambda: OWN_IPS)
    assert {hosts.verdict(header) for header, _ in TABLE} == {Verdict.UNCHECKED}
    assert hosts.allows("evil.example")


@pytest.mark.parametrize("bind, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False), ("192.0.2.1", False), ("10.0.0.1", False),
])
def test_which_servers_check(bind, loopback):
    assert listens_on_loopback(bind) is loopback
    assert Hosts.of(bind).checked is loopback


@pytest.mark.parametrize("hostport, split", [
    ("a:1", ("a", "1")), ("a:", ("a", "")), (":1", ("", "1")), ("[::1]:80", ("::1", "80")),
    ("[::1%lo0]:80", ("::1%lo0", "80")), ("a", None), ("::1", None), ("[::1]", None), ("[::1]x:80", None),
    ("[::1]:80:90", None), ("[a]:b]:1", None), ("a[:1", None), ("a]:1", None), ("", None),
])
def test_split_host_port_as_go(hostport, split):
    assert split_host_port(hostport) == split


def test_parse_ip_as_netip():
    assert parse_ip("::1%lo") is not None and parse_ip("1.2.3.4") is not None
    for text in ("1.2.3.4%eth0", "::1%", "01.2.3.4", "1.2.3", "[::1]", " 1.2.3.4", "١.2.3.4", ""):
        assert parse_ip(text) is None, text


def test_this_machines_hostname_and_addresses():
    own = interface_addresses()
    assert ipaddress.ip_address("127.0.0.1") in own
    hosts = Hosts(True)
    assert hosts.verdict(socket.gethostname()) is NAME
    assert hosts.verdict(socket.gethostname().upper() + ":11434") is NAME
    for ip in own:
        header = f"[{ip}]:11434" if ip.version == 6 else f"{ip}:11434"
        assert hosts.verdict(header) is IP, header
    assert hosts.verdict("evil.example") is REFUSED
