"""Operations for Huawei's vendor packages: fetch them verified, run their installers unattended.

Each install operation reads the installed version with a fact at execution time and
does nothing when it already matches the profile.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files

from ascend_fleet.core.node_layout import INSTALL_LOCK, INSTALL_LOG, PACKAGE_DIR
from ascend_fleet.facts.ascend import (
    ASCEND_HOME,
    INSTALL_TIMEOUT_SECONDS,
    AscendDriver,
    AscendFirmware,
    CannPackages,
)

# Where a worker's peer server (templates/weights-peer-nginx.conf.j2) serves PACKAGE_DIR's verified files.
PEER_PACKAGES_PATH = "packages"
# A peer is a fleet node on the same network: one that does not answer this fast is down.
PEER_CONNECT_TIMEOUT_SECONDS = 3
# Huawei's installers exit 2 for "done, takes effect after a reboot".
SUCCESS_CODES = (0, 2)


@operation()
def package_fetched(file_name: str, sha256: str, url: str | None = None, local_path: str | None = None,
                    dest_dir: str = PACKAGE_DIR, peer_urls: list[str] | None = None):
    """
    Put a vendor package on the node, checked against its sha256 before it takes its final name.

    + file_name: the package's file name, e.g. Ascend-hdk-910b-npu-driver_25.2.0_linux-aarch64.run
    + sha256: the checksum the profile pins
    + url: download it from here (an HTTP mirror) ...
    + local_path: ... or upload this file from the control machine (files/)
    + dest_dir: where packages are kept on the node
    + peer_urls: other workers' peer servers, asked in order before the origin (url or local_path)
    """
    dest = f"{dest_dir}/{file_name}"
    if host.get_fact(Sha256File, path=dest) == sha256:
        host.noop(f"{file_name} is already on the node, verified")
        return
    partial = f"{dest}.partial"
    yield f"mkdir -p {shlex.quote(dest_dir)}"
    if peer_urls:
        yield from_peers_command(file_name, sha256, partial, dest, peer_urls)
        # Read again when the run gets here: the origin is asked only if no peer had a verified copy.
        if host.get_fact(Sha256File, path=dest) == sha256:
            return
    if local_path:
        yield from files.put._inner(src=local_path, dest=partial)
    else:
        # A mirror that is down or answers an error is one line naming it, not curl's alone; one
        # that drops connections fails in about a minute (3 retries), not after the kernel's SYN retries.
        yield (f"curl -fsSL --connect-timeout 15 --retry 3 -o {shlex.quote(partial)} {shlex.quote(url)} || {{ rc=$?; "
               f"rm -f {shlex.quote(partial)}; echo \"{host.name}: {file_name}: cannot download {url} (curl exit $rc); "
               f"check that the vendor mirror is up and vendor_mirror_url is right, then rerun\" >&2; exit 1; }}")
    # A corrupt copy never becomes the package an installer runs.
    yield (f"{verify_command(partial, sha256)} || {{ rm -f {shlex.quote(partial)}; "
           f"echo \"{file_name} from {url or local_path} has sha256 $actual, the profile expects {sha256}: "
           f"the copy is corrupt or the profile is wrong; fix it and rerun\" >&2; exit 1; }}; "
           f"{install_command(partial, dest)}")


@operation()
def package_seeded(seeder: str, file_name: str, sha256: str, url: str | None = None, local_path: str | None = None,
                   peer_urls: list[str] | None = None):
    """
    Fetch a package on its seeder before the rest of the fleet asks the peers for it (pyinfra runs
    an operation on every host before the next), so the origin sends it once, not once per worker.

    + seeder: the worker that fetches it now; on the others this does nothing
    + file_name, sha256, url, local_path, peer_urls: as package_fetched (a rebuilt seeder takes it
      from a peer that holds it)
    """
    if host.name != seeder:
        host.noop(f"{seeder} fetches {file_name} for the fleet; this worker takes it from a peer next")
        return
    yield from package_fetched._inner(file_name=file_name, sha256=sha256, url=url, local_path=local_path,
                                      peer_urls=peer_urls)


def verify_command(path: str, sha256: str) -> str:
    """Shell: true when the file's sha256 is the expected one; leaves it in $actual."""
    return f"actual=$(sha256sum {shlex.quote(path)} | cut -d' ' -f1) && [ \"$actual\" = {sha256} ]"


def install_command(partial: str, dest: str) -> str:
    """Shell: a verified copy takes its final name (the only name peers serve)."""
    return f"mv {shlex.quote(partial)} {shlex.quote(dest)} && chmod 0755 {shlex.quote(dest)}"


def from_peers_command(file_name: str, sha256: str, partial: str, dest: str, peer_urls: list[str]) -> str:
    """Shell: take the package from the first peer whose copy matches the profile's sha256; a copy
    that does not is deleted (never installed, never served on) and the next peer asked. A peer that
    is down fails its connect in seconds; one that stalls is left after 30 s below 1 kB/s.
    Succeeds either way: when no peer had it, dest is still missing and the origin is next."""
    peers = " ".join(shlex.quote(f"{peer.rstrip('/')}/{PEER_PACKAGES_PATH}/{file_name}") for peer in peer_urls)
    return (f"for src in {peers}; do "
            f"if curl -fsS --connect-timeout {PEER_CONNECT_TIMEOUT_SECONDS} --speed-limit 1024 --speed-time 30 "
            f"-o {shlex.quote(partial)} \"$src\" 2>/dev/null; then "
            f"if {verify_command(partial, sha256)}; then {install_command(partial, dest)} && "
            f"echo \"{file_name} from $src, sha256 verified\" && exit 0; fi; "
            f"echo \"{host.name}: {file_name} from $src has sha256 $actual, the profile expects {sha256}: "
            f"refused and deleted, trying the next source (that peer fetches it again at its next deploy)\" >&2; "
            f"fi; rm -f {shlex.quote(partial)}; done; "
            f"echo \"{file_name}: no peer holds a verified copy, fetching it from the origin\"")


def installer_command(package: str, flags: str, env_scripts: list[str] | None = None) -> str:
    """Run a .run installer unattended: closed stdin (a prompt fails instead of hanging), a time limit,
    exit codes 0 and 2 as success, anything else one line with the installer's last words.
    `env_scripts`: set_env.sh files to look for; the first that exists is sourced for the installer,
    and none existing fails in one line before it runs (a bare `. ` exits 2, which would pass)."""
    log = INSTALL_LOG
    probe = source = ""
    if env_scripts:
        names = " nor ".join(env_scripts)
        probe = (f"env_script=; for f in {' '.join(shlex.quote(s) for s in env_scripts)}; do "
                 f"if [ -f \"$f\" ]; then env_script=$f; break; fi; done; "
                 f"if [ -z \"$env_script\" ]; then echo \"{package}: no CANN toolkit environment to install it "
                 f"with: neither {names} exists; install the CANN toolkit first\" >&2; exit 1; fi; ")
        source = '. "$env_script" && '
    # Under the install lock: a rerun's installer waits for one still running from a dropped session.
    return (f"{probe}( {source}flock -w {INSTALL_TIMEOUT_SECONDS} {INSTALL_LOCK} "
            f"timeout {INSTALL_TIMEOUT_SECONDS} {PACKAGE_DIR}/{package} {flags} </dev/null ) "
            f">>{log} 2>&1; rc=$?; "
            f"if [ $rc -ne 0 ] && [ $rc -ne 2 ]; then echo \"{package} {flags} failed (exit $rc): "
            f"$(tail -n 3 {log} | tr '\\n' ' ')(full log: {log})\" >&2; exit 1; fi")


def driver_is_current(version: str, install_path: str = ASCEND_HOME) -> bool:
    """The node has this driver version, completely installed (the driver operation does nothing)."""
    installed = host.get_fact(AscendDriver, install_path=install_path)
    return bool(installed) and installed["version"] == version and installed["complete"]


def firmware_is_current(version: str, install_path: str = ASCEND_HOME) -> bool:
    """The node's installed firmware package is this version (the firmware operation does nothing)."""
    return host.get_fact(AscendFirmware, install_path=install_path) == version


@operation()
def driver(version: str, package: str, install_path: str = ASCEND_HOME):
    """
    Install or upgrade the NPU driver; it takes effect at the next reboot.

    + version: the driver version the profile pins
    + package: its .run file name in the node's package directory
    + install_path: Ascend install root
    """
    if driver_is_current(version, install_path):
        host.noop(f"NPU driver {version} is installed")
        return
    installed = host.get_fact(AscendDriver, install_path=install_path)
    flags = "--nox11 --upgrade --quiet" if installed else "--nox11 --full --quiet --install-for-all"
    yield installer_command(package, flags)


@operation()
def firmware(version: str, package: str, install_path: str = ASCEND_HOME):
    """
    Install or upgrade the NPU firmware; it takes effect at the next reboot.

    + version: the firmware version the profile pins
    + package: its .run file name in the node's package directory
    + install_path: Ascend install root
    """
    if firmware_is_current(version, install_path):
        host.noop(f"NPU firmware {version} is installed")
        return
    installed = host.get_fact(AscendFirmware, install_path=install_path)
    flags = "--nox11 --upgrade --quiet" if installed else "--nox11 --full --quiet"
    yield installer_command(package, flags)


@operation()
def cann_part(part: str, version: str, package: str, install_path: str = ASCEND_HOME):
    """
    Install or upgrade one CANN part: the toolkit, then its operator kernels/ops, then NNAL.

    + part: toolkit | kernels | nnal (kernels and NNAL install with the toolkit's environment sourced)
    + version: the version the profile pins
    + package: its .run file name in the node's package directory
    + install_path: Ascend install root
    """
    installed = host.get_fact(CannPackages, install_path=install_path)
    if installed.get(part) == version:
        host.noop(f"CANN {part} {version} is installed")
        return
    action = "--upgrade" if installed.get(part) else "--install"
    if part == "toolkit":
        yield installer_command(package, f"{action} --quiet --install-for-all")
        return
    yield installer_command(package, f"{action} --quiet", env_scripts=toolkit_env_scripts(install_path))


def toolkit_env_scripts(install_path: str = ASCEND_HOME) -> list[str]:
    """Where the toolkit's set_env.sh is, by the installed CANN's layout (8.5 on: cann/; before: ascend-toolkit/)."""
    return [f"{install_path}/cann/set_env.sh", f"{install_path}/ascend-toolkit/set_env.sh"]
