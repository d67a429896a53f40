"""A control group of its own for each lab node.

systemd-nspawn without a host systemd to register with (`--register=no --keep-unit`) puts the
container in `payload/` under the cgroup it was started in. Every node started from the same
cgroup would get the same `payload/`, and their systemds would share one tree: a unit starting
on one node while the same unit ends on another found its cgroup just removed and failed with
219/CGROUP (the instance firewall after a fleet-wide reboot, issue 17). So each node's
supervisor first moves into a cgroup named after the lab and the node, in each hierarchy
nspawn uses (systemd's own and the unified one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from ascend_fleet.core.errors import FleetError


def systemd_hierarchies(mountinfo: str, own_cgroups: str) -> list[Path]:
    """The directories of the hierarchies nspawn makes its `payload/` in, for the process whose
    /proc/PID/mountinfo and /proc/PID/cgroup are given: cgroup2 (`0::`) and the v1 `name=systemd`."""
    own = {}
    for line in own_cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        root, mount_point = fields[3], fields[4]
        fs_type, options = fields[fields.index("-") + 1], fields[fields.index("-") + 3].split(",")
        key = "" if fs_type == "cgroup2" else "name=systemd" if fs_type == "cgroup" and "name=systemd" in options else None
        if key is not None and key in own and Path(own[key]).is_relative_to(root):
            found.append(Path(mount_point) / Path(own[key]).relative_to(root))
    return found


def node_cgroups(lab_name: str, node_name: str) -> list[Path]:
    """Where this node's supervisor goes: beside this process, in each hierarchy nspawn uses."""
    hierarchies = systemd_hierarchies(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    return [hierarchy / f"ascend-fleet-lab-{lab_name}-{node_name}" for hierarchy in hierarchies]


def join(cgroups: list[str]) -> None:
    """Move this process into each cgroup (created if missing); its children start there."""
    for cgroup in map(Path, cgroups):
        cgroup.mkdir(exist_ok=True)
        (cgroup / "cgroup.procs").write_text("0")


def remove(entry: dict, timeout: float = 10) -> None:
    """Remove a node's cgroups and what its systemd left in them. What still runs in them is the
    node's (a container whose systemd-nspawn was killed outlives it) and is ended with SIGKILL;
    a tree that will not go is said in one line."""
    deadline = time.monotonic() + timeout
    for top in map(Path, entry["paths"]):
        while top.is_dir():
            for cgroup in _deepest_first(top):
                with contextlib.suppress(FileNotFoundError):  # the node's systemd prunes its own
                    for pid in (cgroup / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):  # busy until its processes have exited
                    cgroup.rmdir()
            if top.is_dir() and time.monotonic() > deadline:
                raise FleetError(f"lab down: cannot remove cgroup {top}: a process of the node is still in it "
                                 f"(find {top} -name cgroup.procs | xargs cat); stop it, then run `lab down` again")
            time.sleep(0.1 if top.is_dir() else 0)


def _deepest_first(top: Path) -> list[Path]:
    return sorted((Path(directory) for directory, _, _ in os.walk(top)), key=lambda path: -len(path.parts))
