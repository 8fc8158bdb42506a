"""A worker says which roles it runs (retro_worker_role_info), so an alert can tell a
missing role from an all-in-one worker that runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.app import ROLES, build_app
from streams.metrics import Metrics
from streams.settings import Settings


@pytest.mark.parametrize("roles", [("clean",), ("batch",), ("compactor",), ("clean", "batch"),
                                   ROLES])
def test_a_worker_exposes_the_roles_it_runs(roles: tuple[str, ...], tmp_path: Path) -> None:
    metrics = Metrics()
    build_app(Settings(state_dir=tmp_path, kafka={"bootstrap": "127.0.0.1:9"}), roles=roles,
              metrics=metrics, web=False)
    get = metrics.registry.get_sample_value
    running = {r for r in ROLES if get("retro_worker_role_info", {"worker_role": r}) == 1}
    assert running == set(roles)
