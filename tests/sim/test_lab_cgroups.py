"""Each lab node's supervisor goes into a cgroup of its own, in the hierarchies nspawn uses."""

from __future__ import annotations

from pathlib import Path

from ascend_fleet.lab.cgroups import systemd_hierarchies

# This machine's: cgroup v1 controllers, systemd's named hierarchy and cgroup2 beside them.
HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_OWN = "9:name=systemd:/\n4:memory:/process_api/926c\n0::/\n"
# A systemd host with cgroup2 only, the command run from a login session.
UNIFIED_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
UNIFIED_OWN = "0::/user.slice/user-0.slice/session-3.scope\n"


def test_hybrid_host_gives_systemds_named_hierarchy_and_the_unified_one_not_the_controllers():
    assert systemd_hierarchies(HYBRID_MOUNTS, HYBRID_OWN) == [Path("/sys/fs/cgroup/systemd"),
                                                              Path("/sys/fs/cgroup/unified")]


def test_unified_host_gives_the_commands_own_cgroup():
    assert systemd_hierarchies(UNIFIED_MOUNTS, UNIFIED_OWN) == [
        Path("/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope")]


def test_a_mount_of_a_subtree_maps_the_path_below_its_root():
    mounts = "41 31 0:38 /lab /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    assert systemd_hierarchies(mounts, "0::/lab/runner\n") == [Path("/sys/fs/cgroup/unified/runner")]
    assert systemd_hierarchies(mounts, "0::/elsewhere\n") == []
