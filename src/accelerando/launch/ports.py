"""Loopback ports for a one-machine rendezvous: is one free, and a free one."""

from __future__ import annotations

import socket


def port_is_free(port: int) -> bool:
    """True when nothing on this machine holds `port` on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port that was free a moment ago on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
