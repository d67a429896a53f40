"""Huawei's vendor packages for the lab: self-extracting .run files with the real names.

Each package is a makeself-style archive (makeself_header.sh, then a gzip'd tar) whose
payload is the simulated installer in payload/ plus a package.json naming the package.
The node needs only sh, coreutils, gzip, tar and python3 to run one. Output is
byte-for-byte deterministic, so the sha256 sums in SHA256SUMS are stable.

    publish_vendor_packages([VendorVersions("24.1.0", ("7.5.0", "7.5.99"), "7.5.0.3.220",
                                            "8.3.RC2", "8.3.RC2")], "aarch64", mirror / "files")
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ascend_fleet.config.profile import ARCHES, CHIP, Stack, vendor_file_names
from ascend_fleet.core import versions as version_order

SIM_DIR = Path(__file__).resolve().parent
PAYLOAD_DIR = SIM_DIR / "payload"
HEADER_TEMPLATE = SIM_DIR / "makeself_header.sh"
COMMON_PAYLOAD = ("versions.py", "ascend_sim.py", "ascend_sim_install.py")
# The payload's version ordering is the project's own, shipped as a plain module.
SHARED_MODULES = {"versions.py": SIM_DIR.parent.parent / "core" / "versions.py"}
DRIVER_PAYLOAD = ("npu_smi.py", "hccn_tool.py", "ascend_sim_activate.py", "ascend-sim-driver.service")
EXECUTABLES = {"ascend_sim_install.py", "npu_smi.py", "hccn_tool.py", "ascend_sim_activate.py"}
# Fixed archive metadata keeps the output identical from run to run (2024-01-01T00:00:00Z).
ARCHIVE_MTIME = 1704067200


def payload_module(name: str):
    """Load a node-side payload module on the host (they import each other by their plain names)."""
    sys.modules.setdefault("versions", version_order)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PAYLOAD_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


sim = payload_module("ascend_sim")


@dataclass(frozen=True)
class VendorVersions:
    """One driver/firmware/CANN stack as a profile names it."""

    driver: str
    driver_fw_compat: tuple[str, str]  # the firmware range the driver accepts, [low, high]
    firmware: str
    cann: str
    nnal: str

    @classmethod
    def of(cls, stack: Stack) -> VendorVersions:
        """The vendor side of a profile's stack."""
        return cls(stack.driver, tuple(stack.driver_firmware_range), stack.firmware, stack.cann, stack.nnal)


@dataclass(frozen=True)
class Package:
    kind: str  # driver | firmware | toolkit | kernels | ops | nnal
    name: str  # package name without version and suffix, e.g. Ascend-cann-toolkit
    version: str
    file_name: str
    metadata: dict


def vendor_packages(versions: VendorVersions, arch: str) -> list[Package]:
    """The five packages of one stack, named as profiles name them (ascend_fleet.config.profile.vendor_file_names)."""
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; use one of {', '.join(ARCHES)}")
    version_of = {"driver": versions.driver, "firmware": versions.firmware, "toolkit": versions.cann,
                  "kernels": versions.cann, "nnal": versions.nnal}
    packages = []
    for kind, file_name in vendor_file_names(versions, arch).items():
        metadata = {"kind": kind, "name": file_name.split("_", 1)[0], "version": version_of[kind], "chip": CHIP}
        if kind == "kernels" and sim.is_ops_era(versions.cann):
            metadata["kind"] = "ops"  # the installer behaves differently from CANN 8.5, not just the name
        if kind != "firmware":  # one firmware file serves every architecture, so its bytes must not vary
            metadata["arch"] = arch
        if kind == "driver":
            metadata["fw_range"] = list(versions.driver_fw_compat)
        packages.append(Package(metadata["kind"], metadata["name"], metadata["version"], file_name, metadata))
    return packages


def _payload_tar_gz(package: Package) -> bytes:
    files = {name: SHARED_MODULES.get(name, PAYLOAD_DIR / name).read_bytes()
             for name in COMMON_PAYLOAD + (DRIVER_PAYLOAD if package.kind == "driver" else ())}
    files["package.json"] = (json.dumps(package.metadata, indent=2, sort_keys=True) + "\n").encode()
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(files[name]), ARCHIVE_MTIME
            info.mode = 0o755 if name in EXECUTABLES else 0o644
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(files[name]))
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", filename="", mtime=ARCHIVE_MTIME) as gz:
        gz.write(tar_bytes.getvalue())
    return compressed.getvalue()


def build_run_file(package: Package) -> bytes:
    """The .run file: the shell header with the payload's line offset and sha256, then the payload."""
    payload = _payload_tar_gz(package)
    template = HEADER_TEMPLATE.read_text()
    header = (template.replace("@LABEL@", f"{package.name} {package.version}")
              .replace("@HEADER_LINES@", str(template.count("\n")))
              .replace("@PAYLOAD_SHA256@", hashlib.sha256(payload).hexdigest()))
    return header.encode() + payload


def write_sha256sums(directory: Path) -> Path:
    """SHA256SUMS over every .run file in directory, in `sha256sum -c` format."""
    lines = [f"{hashlib.sha256(run.read_bytes()).hexdigest()}  {run.name}\n"
             for run in sorted(directory.glob("*.run"))]
    sums = directory / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def publish_vendor_packages(stacks: Iterable[VendorVersions], arch: str, files_dir: Path) -> list[Path]:
    """Write every stack's packages into files_dir (the mirror's /files/) and refresh its SHA256SUMS.

    Stacks may share packages (two stacks on one driver); the same file name with two
    different contents (one driver version, two firmware ranges) is an error.
    """
    built: dict[str, bytes] = {}
    for versions in stacks:
        for package in vendor_packages(versions, arch):
            content = build_run_file(package)
            if built.setdefault(package.file_name, content) != content:
                raise ValueError(f"{package.file_name} is asked for twice with different contents; "
                                 "give each driver version one firmware range")
    files_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, content in built.items():
        path = files_dir / file_name
        path.write_bytes(content)
        path.chmod(0o755)
        paths.append(path)
    write_sha256sums(files_dir)
    return paths


def preinstall_driver(root: Path, driver_version: str, fw_compat: tuple[str, str], firmware_version: str,
                      accounts_from: Path | None = None) -> None:
    """Leave a driver and firmware installed on a node root before its first boot, as on a used server.

    Writes what the driver and firmware packages would (version files, npu-smi, the boot
    unit, /etc/ascend_install.info) plus the HwHiAiUser account; the driver is running from
    the node's first boot. `root` may be an overlay's upper directory: then pass the lower
    root as `accounts_from`, whose passwd/group/shadow files the account is added to.
    """
    installer = payload_module("ascend_sim_install")
    node = sim.Node(root)
    _add_hdk_account(root, accounts_from or root)
    installer.write_driver_files(node, {"version": driver_version, "fw_range": fw_compat}, PAYLOAD_DIR,
                                 sim.DEFAULT_BASE, for_all=True, install_boot_id="preinstalled")
    installer.write_firmware_files(node, firmware_version, sim.DEFAULT_BASE)


def _add_hdk_account(root: Path, accounts_from: Path) -> None:
    """Add HwHiAiUser (user and group) to root's account files, starting from accounts_from's."""
    user = sim.HDK_USER
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    tables = {name: (accounts_from / "etc" / name).read_text() for name in ("passwd", "group", "shadow", "gshadow")}
    if any(line.startswith(f"{user}:") for line in tables["passwd"].splitlines()):
        return
    taken = {int(line.split(":")[2]) for table in ("passwd", "group")
             for line in tables[table].splitlines() if line.count(":") >= 3}
    uid = next(n for n in range(1000, 60000) if n not in taken)
    additions = {"passwd": f"{user}:x:{uid}:{uid}::/home/{user}:/bin/bash\n",
                 "group": f"{user}:x:{uid}:\n", "shadow": f"{user}:!:19723:0:99999:7:::\n",
                 "gshadow": f"{user}:!::\n"}
    for name, line in additions.items():
        source = (accounts_from / "etc" / name).stat()
        path = etc / name
        path.write_text(tables[name].rstrip("\n") + "\n" + line)
        os.chown(path, source.st_uid, source.st_gid)  # shadow files stay root:shadow 0640
        path.chmod(source.st_mode & 0o7777)
    home = root / "home" / user
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o750)
    os.chown(home, uid, uid)
