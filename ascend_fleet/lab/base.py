"""The base every lab node boots from: built once with debootstrap, then cached; one per family
(flavours.py): Debian as debootstrap makes it, or Debian made into an RPM-based system."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from pathlib import Path

from rich.console import Console

from ascend_fleet.fleet.profile_check import manylinux_platforms
from ascend_fleet.lab.host import run
from ascend_fleet.lab.spec import CACHE_DIR

SUITE = "bookworm"
# Debian bookworm's glibc is 2.36: the newest manylinux a node's python3 can load.
NODE_GLIBC_MINOR = 36
# What any fresh server has: systemd, sshd, a Python for tooling. Everything a deploy
# needs beyond this, it installs itself through the lab mirror.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "iproute2", "python3",
    "ca-certificates", "curl", "procps", "sudo", "iputils-ping", "kmod", "less",
]
# An RPM-family node's own tools: Debian's real dnf and rpm, firewalld (openEuler's default firewall,
# active from the first boot; its polkitd needs a logind: libpam-systemd's; it reads protocol names from
# /etc/protocols: netbase's, openEuler's `setup`), and venv, which openEuler's python3 includes and Debian
# splits off.
RPM_FAMILY_PACKAGES = ["dnf", "rpm", "firewalld", "libpam-systemd", "netbase", "python3-venv"]
# What an RPM-family node must not have: Debian's package tools (a product bug calling apt on an
# openEuler node fails in the lab as on a real one: command not found) and Debian's identity.
DEBIAN_ONLY = ["usr/bin/apt", "usr/bin/apt-get", "usr/bin/apt-cache", "usr/bin/apt-config", "usr/bin/apt-mark",
               "usr/bin/apt-key", "usr/bin/apt-cdrom", "usr/bin/dpkg", "usr/bin/dpkg-query", "usr/bin/dpkg-deb",
               "usr/bin/dpkg-divert", "usr/bin/dpkg-split", "usr/bin/dpkg-trigger", "usr/bin/dpkg-statoverride",
               "usr/bin/dpkg-maintscript-helper", "usr/bin/dpkg-realpath", "etc/debian_version", "etc/apt"]
# Where rpm keeps its database on openEuler (Debian's rpm defaults to ~/.rpmdb).
RPM_DBPATH = "/var/lib/rpm"
# Timers that would take the dpkg lock at random moments under a deploy.
MASKED_UNITS = ["apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"]


def node_platforms(arch: str) -> list[str]:
    """The manylinux tags a lab node's Python accepts, newest first."""
    return manylinux_platforms(arch, NODE_GLIBC_MINOR)


def base_image(debian_upstream: str, console: Console, family: str = "debian") -> Path:
    """The cached base root of this family for this package set, built now if missing."""
    packages = PACKAGES + (RPM_FAMILY_PACKAGES if family == "rpm" else [])
    words = [SUITE, debian_upstream, *packages, *MASKED_UNITS]
    if family == "rpm":
        words += [*DEBIAN_ONLY, RPM_DBPATH]
    key = hashlib.sha256(" ".join(words).encode()).hexdigest()[:12]
    # The Debian base keeps its name (and so the cache labs built before families existed).
    root = CACHE_DIR / "base" / (f"debian-{SUITE}-{key}" if family == "debian" else f"{family}-{SUITE}-{key}")
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
        console.print(f"lab: building the {family} {SUITE} base with debootstrap into {root} (once, about a minute)")
        run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(building),
             f"{debian_upstream}/debian"], what="debootstrap of the lab base", timeout=1800)
        _prepare(building)
        if family == "rpm":
            _make_rpm_family(building)
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


def _make_rpm_family(root: Path) -> None:
    """Debian's tools and identity out, rpm's database where openEuler keeps it (each node registers
    its distribution's preinstalled packages in it: nodes.write_rpm_identity)."""
    for path in DEBIAN_ONLY:
        target = root / path
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    macros = root / "etc" / "rpm" / "macros.dbpath"
    macros.parent.mkdir(parents=True, exist_ok=True)
    macros.write_text(f"%_dbpath {RPM_DBPATH}\n")
