"""Free TCP ports: one for a server started a moment later (the demo's views, the local
broker, the tests' workers), and whether a given one is free."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED = 10000
_PICKS = random.SystemRandom()  # a program that seeds random must not make runs pick alike


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (servers bind with SO_REUSEADDR)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a process that binds it a moment later.

    Picked at random below the kernel's ephemeral range when that is known: outgoing
    connections and port-0 binds never take one of those in the meantime, so only
    another pick like this one (one in thousands) can. Else the kernel's choice.
    """
    family = _family(host)
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - LOWEST_PICKED >= 1000:
        for _ in range(50):
            port = _PICKS.randrange(LOWEST_PICKED, low)
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
