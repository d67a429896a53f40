"""Unit-test-wide: the fleet lease's host (fleetlease.py) is this machine, its directory a temporary one.

The lease scripts run here in `sh` as they would on a gateway over SSH, so the rules they hold (held,
stale, released) are the real script's; nothing connects anywhere.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from ascend_fleet.config import fleetlease
from ascend_fleet.core.node_layout import FLEET_LEASE_DIR


@dataclass
class LeaseHost:
    directory: Path  # where this test's lease scripts keep the lease and the fleet's records
    ran_on: list[str] = field(default_factory=list)  # the host of each script run, in order


@pytest.fixture(autouse=True)
def lease_host(tmp_path_factory, monkeypatch) -> LeaseHost:
    lease = LeaseHost(tmp_path_factory.mktemp("lease"))
    directory, ran_on = lease.directory, lease.ran_on

    def run_script(host: str, data, script: str, timeout: float):
        ran_on.append(host)
        result = subprocess.run(["sh", "-c", script.replace(FLEET_LEASE_DIR, str(directory))], capture_output=True,
                                text=True, timeout=timeout)
        return SimpleNamespace(status=result.returncode, output=result.stdout + result.stderr)

    monkeypatch.setattr(fleetlease, "remote", SimpleNamespace(run_script=run_script))
    return lease
