"""The distributions a lab node can run: Debian (the base image as built), and openEuler-shaped
nodes made from it (docs/sim-fidelity.md, "openEuler lab node": what is real, what is stood in).

A flavour's identity files are the real ones, as captured on real hosts (sources in the ledger);
its packages come from the lab's own RPM repository (rpmrepo.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OsName = Literal["debian-12", "openeuler-24.03", "kylin-v10"]
DEFAULT_OS: OsName = "debian-12"


@dataclass(frozen=True)
class Flavour:
    """family: the base image the node boots ("debian", or "rpm": Debian with dnf, rpm and firewalld,
    apt and dpkg removed); os_release: /etc/os-release (and /usr/lib/os-release); release_files: the
    distribution's own /etc/*-release files, /etc/system-release linked to the first."""

    family: Literal["debian", "rpm"]
    os_release: str = ""
    release_files: tuple[tuple[str, str], ...] = ()


FLAVOURS: dict[str, Flavour] = {
    "debian-12": Flavour("debian"),
    # openEuler 24.03 LTS as `cat /etc/os-release` and /etc/openEuler-release print it on real hosts.
    "openeuler-24.03": Flavour(
        "rpm",
        'NAME="openEuler"\nVERSION="24.03 (LTS)"\nID="openEuler"\nVERSION_ID="24.03"\n'
        'PRETTY_NAME="openEuler 24.03 (LTS)"\nANSI_COLOR="0;31"\n\n',
        (("openEuler-release", "openEuler release 24.03 (LTS)\n"),)),
    # Kylin Linux Advanced Server V10 SP2 (Sword), as a real host prints it: a node the product refuses.
    "kylin-v10": Flavour(
        "rpm",
        'NAME="Kylin Linux Advanced Server"\nVERSION="V10 (Sword)"\nID="kylin"\nVERSION_ID="V10"\n'
        'PRETTY_NAME="Kylin Linux Advanced Server V10 (Sword)"\nANSI_COLOR="0;31"\n\n',
        (("kylin-release", "Kylin Linux Advanced Server release V10 (Sword)\n"),)),
}
