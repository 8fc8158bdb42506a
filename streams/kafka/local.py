"""Where the local broker that ``retro broker start`` launched listens: its state file.

Commands find the broker here without importing the launcher (a development tool).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BrokerState:
    """What `retro broker status` prints and other commands read to find the broker."""

    pid: int
    port: int
    controller_port: int
    bootstrap: str
    version: str
    directory: str
    log_file: str


def local_broker_state(state_dir: Path) -> BrokerState | None:
    """The running local broker's state, or None (stale state files are removed)."""
    state_file = state_file_of(state_dir)
    if not state_file.exists():
        return None
    state = BrokerState(**json.loads(state_file.read_text()))
    if pid_alive(state.pid) and port_open(state.port):
        return state
    if not pid_alive(state.pid):
        state_file.unlink(missing_ok=True)
        return None
    return state  # alive but not listening yet


def state_file_of(state_dir: Path) -> Path:
    return Path(state_dir).resolve() / "broker" / "state.json"


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists"; treat it as dead
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
