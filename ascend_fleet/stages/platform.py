"""The driver and CANN stages: the NPU driver and firmware (with the one reboot they need), then CANN."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from ascend_fleet import FILES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.profile import Profile
from ascend_fleet.core.bundle_layout import VENDOR_DIR
from ascend_fleet.core.node_layout import INSTALL_LOG
from ascend_fleet.facts.ascend import AscendDriver, NpuStatus, RunningFirmware
from ascend_fleet.operations import accounts, gates, reboot, vendor
from ascend_fleet.stages.context import (
    host_arch,
    host_os,
    node_profile,
    os_packages,
    running_kernel_headers,
    runs_npus,
)
from ascend_fleet.stages.peers import peer_server, spread_of_package

HDK_USER = "HwHiAiUser"
# npu-smi's words when no driver is loaded in this boot (also right after a driver install).
DRIVER_NOT_LOADED = "dcmi module initialize failed"


def fetch_packages(profile: Profile, kinds: list[str]) -> dict[str, str]:
    """Put the profile's packages of these kinds on the node, verified; kind -> file name. Over the
    fleet, each package comes from a peer that verified it; its seeder asks the origin only if none did."""
    config = host_node_config(host)
    names = {kind: name for kind, name in profile.vendor_files(host_arch()).items() if kind in kinds}
    spreads = {name: spread_of_package(host.name, name) for name in names.values()}
    if any(spreads.values()):
        peer_server(config)
    for name, spread in spreads.items():
        if config.bundle_dir:  # the site's bundle holds every package, checked against the profile when it was made
            source = {"local_path": str(Path(config.bundle_dir) / VENDOR_DIR / name)}
        elif profile.packages.source == "mirror":
            source = {"url": f"{config.vendor_mirror_url}/{name}"}
        else:
            source = {"local_path": str(FILES / name)}
        sha256 = profile.sha256_of(name)
        peer_urls = spread.peer_urls if spread else None
        if spread:
            vendor.package_seeded(name=f"Fetch {name} on {spread.seeder} for the fleet", seeder=spread.seeder,
                                  file_name=name, sha256=sha256, peer_urls=peer_urls, **source)
        vendor.package_fetched(name=f"Fetch {name}", file_name=name, sha256=sha256, peer_urls=peer_urls, **source)
    return names


def install_prerequisites() -> None:
    """What the driver installer needs (node_os.py): it builds its kernel module with dkms against the
    running kernel's headers and refuses without lspci/ifconfig."""
    known = host_os()
    server.group(name=f"Group {HDK_USER}", group=HDK_USER)
    accounts.user(name=f"User {HDK_USER}", user=HDK_USER, group=HDK_USER, home=f"/home/{HDK_USER}",
                  shell="/bin/bash")
    os_packages("Driver prerequisites", list(known.driver_prerequisites))
    headers = running_kernel_headers()
    # Where they are required, preflight refused a node none of whose repositories (or bundle) has them.
    wanted = headers["not_installed"] if known.kernel_headers_required else headers["listed"]
    if wanted:
        os_packages(f"Headers of the running kernel {headers['kernel']}", wanted)
    else:
        installed = ", ".join(headers["installed"])
        host.noop(f"{installed} installed" if installed
                  else f"no headers package of the running kernel {headers['kernel']} in the node's repositories")


def npu_problem(expected: int) -> str | None:
    """Why the node's NPUs are not ready to serve (npu-smi fails, a count off the inventory,
    an unhealthy card), or None."""
    status = host.get_fact(NpuStatus)
    if not status["ok"]:
        return (f"npu-smi fails: {status['error']}; check that the driver and firmware versions match "
                f"(profile) and {INSTALL_LOG}")
    if len(status["npus"]) != expected:
        return (f"npu-smi lists {len(status['npus'])} NPUs but the inventory says npu_count={expected}; "
                "fix the inventory or the hardware")
    unhealthy = [f"NPU {n['id']} {n['health']}" for n in status["npus"] if n["health"] != "OK"]
    if unhealthy:
        return f"unhealthy: {', '.join(unhealthy)}; see `npu-smi info -t health -i N`, replace or drain the card"
    return None


def needs_reboot(driver: str, firmware: str) -> bool:
    """The driver or firmware is not the profile's, or is installed but not running in this boot."""
    # An earlier run that installed but never got to its reboot (interrupted, the node lost) left
    # a driver that is installed but not loaded (npu-smi says so), or a firmware package the NPUs
    # do not run yet (npu-smi's board view says what they run): the reboot finishes the job.
    not_loaded = host.get_fact(AscendDriver) and DRIVER_NOT_LOADED in host.get_fact(NpuStatus)["error"]
    running = host.get_fact(RunningFirmware)
    firmware_pending = running is not None and running != firmware
    return bool(not_loaded) or firmware_pending or not (vendor.driver_is_current(driver)
                                                         and vendor.firmware_is_current(firmware))


def reboot_refusal(config: NodeConfig, driver: str, firmware: str, reboots: bool) -> str | None:
    """Why a run that may restart only some of the node's instances (config.serve_only, a rollout
    one instance at a time) cannot take the driver stage: its reboot stops them all."""
    if not reboots:
        return None
    others = [i.name for i in config.instances if i.name not in config.serve_only]
    return (f"driver {driver} / firmware {firmware} need a reboot, which stops {', '.join(others)} too, but this "
            f"run may restart only {', '.join(config.serve_only)}; roll it out with --max-unavailable "
            f"{len(config.instances)} or more (whole hosts), then go back to one at a time")


@deploy("NPU driver and firmware")
def driver_stage() -> None:
    """Driver then firmware on a fresh node, firmware then driver on a node that has a driver
    (Huawei's order); one reboot only if either changed; then every NPU must answer healthy."""
    gates.stage_begins(name="Stage: driver and firmware", stage="driver and firmware")
    if not runs_npus():
        return
    config, stack = host_node_config(host), node_profile().stack
    # Decided from the state the run starts from, so a dry run on a converged node shows no reboot.
    reboots = needs_reboot(stack.driver, stack.firmware)
    if config.serve_only:
        gates.passed(name="No reboot while the node's other instances serve",
                     description="driver and firmware current, no reboot",
                     find_problem=lambda: reboot_refusal(config, stack.driver, stack.firmware, reboots))
    install_prerequisites()
    names = fetch_packages(node_profile(), ["driver", "firmware"])

    def install_driver():
        vendor.driver(name=f"NPU driver {stack.driver}", version=stack.driver, package=names["driver"])

    def install_firmware():
        vendor.firmware(name=f"NPU firmware {stack.firmware}", version=stack.firmware, package=names["firmware"])

    if host.get_fact(AscendDriver):
        install_firmware()
        install_driver()
    else:
        install_driver()
        install_firmware()
    if reboots:
        reboot.rebooted(name="Reboot to load the new driver and firmware", why="to load the new driver and firmware",
                        reboot_timeout=config.reboot_timeout)
    expected = config.npu_count
    gates.passed(name="Every NPU listed and healthy", description=f"{expected} NPUs listed, all healthy",
                 find_problem=lambda: npu_problem(expected))


@deploy("CANN")
def cann_stage() -> None:
    """Toolkit, then operator kernels/ops with the toolkit's environment sourced, then NNAL."""
    gates.stage_begins(name="Stage: CANN", stage="CANN")
    if not runs_npus():
        return
    profile = node_profile()
    names = fetch_packages(profile, ["toolkit", "kernels", "nnal"])
    stack = profile.stack
    for part, version in (("toolkit", stack.cann), ("kernels", stack.cann), ("nnal", stack.nnal)):
        vendor.cann_part(name=f"CANN {part} {version}", part=part, version=version, package=names[part])
