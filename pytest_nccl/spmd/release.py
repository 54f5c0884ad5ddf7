"""Releasing a rank stuck in a collective: shut down its TCP connections (gloo's own ``abort()`` does
not release a pending recv, measured on torch 2.13)."""

from __future__ import annotations

import os
import socket
from enum import Enum


class TcpState(str, Enum):
    """A socket's state in ``/proc/net/tcp`` (hex, as the kernel writes it)."""
    ESTABLISHED = "01"


def _tcp_table() -> dict:
    """socket inode -> (local port, remote port, state) for every TCP socket on this host."""
    table = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            p = line.split()
            try:
                table[int(p[9])] = (int(p[1].rsplit(":", 1)[1], 16), int(p[2].rsplit(":", 1)[1], 16), p[3])
            except (IndexError, ValueError):
                continue
    return table


def abort_connections(keep_ports: set) -> int:
    """Shut down every established TCP connection of this process except those to or from the
    ports in ``keep_ports`` (the launcher's store). A peer or this rank blocked on such a connection
    (a gloo collective, a TCPStore rendezvous) gets an error at once. Listening sockets are left
    alone (gloo aborts the process when its listener fails)."""
    table = _tcp_table()
    count = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        entry = table.get(int(target[8:-1]))
        if entry is None:
            continue
        local, remote, state = entry
        if state != TcpState.ESTABLISHED or local in keep_ports or remote in keep_ports:
            continue
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
            try:
                s.shutdown(socket.SHUT_RDWR)
                count += 1
            finally:
                s.close()
        except OSError:
            continue
    return count
