"""The Debian base every lab node boots from: built once with debootstrap, then cached."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from pathlib import Path

from rich.console import Console

from ascend_fleet.lab.host import run
from ascend_fleet.lab.spec import CACHE_DIR
from ascend_fleet.profile_check import manylinux_platforms

SUITE = "bookworm"
# Debian bookworm's glibc is 2.36: the newest manylinux a node's python3 can load.
NODE_GLIBC_MINOR = 36
# What any fresh server has: systemd, sshd, a Python for tooling. Everything a deploy
# needs beyond this, it installs itself through the lab mirror.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "iproute2", "python3",
    "ca-certificates", "curl", "procps", "sudo", "iputils-ping", "kmod", "less",
]
# Timers that would take the dpkg lock at random moments under a deploy.
MASKED_UNITS = ["apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"]


def node_platforms(arch: str) -> list[str]:
    """The manylinux tags a lab node's Python accepts, newest first."""
    return manylinux_platforms(arch, NODE_GLIBC_MINOR)


def base_image(debian_upstream: str, console: Console) -> Path:
    """The cached base root for this package set, built now if missing."""
    key = hashlib.sha256(" ".join([SUITE, debian_upstream, *PACKAGES, *MASKED_UNITS]).encode()).hexdigest()[:12]
    root = CACHE_DIR / "base" / f"debian-{SUITE}-{key}"
    if (root / "etc" / "os-release").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    # Two labs coming up at once (the tests run two) build it once: the second waits for the first.
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "etc" / "os-release").exists():
            return root
        building = root.with_name(root.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        # A line, not a status: `lab up` builds it beside its own status.
        console.print(f"lab: building the Debian {SUITE} base with debootstrap into {root} (once, about a minute)")
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(building),
             f"{debian_upstream}/debian"], what="debootstrap of the lab base", timeout=1800)
        _prepare(building)
        building.rename(root)
    return root


def _prepare(root: Path) -> None:
    """Make the base node-neutral: each node gets its own host keys and machine id."""
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    for unit in MASKED_UNITS:
        mask = root / "etc" / "systemd" / "system" / unit
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")
    shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
    (root / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True)
