"""A port picked for a server started a moment later."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from streams import ports


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_port_is_picked_below_the_kernels_ephemeral_range(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # outgoing connections take ports from that range: one below it stays free
    (tmp_path / "range").write_text("40000\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    picked = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST_PICKED <= p < 40000 and bindable(p) for p in picked)
    assert len(picked) > 1  # at random: two runs side by side do not pick alike


def test_without_the_range_the_kernel_picks(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not real.exists():
        pytest.skip("no /proc here: the kernel's range is not known")
    low, high = map(int, real.read_text().split())
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "absent")
    port = ports.free_port()
    assert low <= port <= high and bindable(port)
