"""State of the simulated Ascend driver, firmware and CANN on one lab node.

Runs on the node with the system python3 (standard library only): the package
installers, the boot-time driver activation and npu-smi all read and write the
node through `Node`. On the host, `Node(root)` points at a node's root directory.

Model of "the driver takes effect after a reboot" (what real kernel modules do):
- an installer writes the package files and, for the driver, the boot id it ran in;
- at boot, ascend-sim-driver.service records the installed driver and firmware as
  loaded for that boot in /run/ascend-sim/loaded.json and creates /dev/davinci*;
- npu-smi works only when the loaded driver is from this boot, the driver was not
  reinstalled since, and the loaded firmware is inside the driver's compatible range.
"""

import json
import re
from pathlib import Path

from versions import in_range, is_ops_era, parse_range, version_key  # noqa: F401 (used by the other payload modules)

DEFAULT_BASE = "/usr/local/Ascend"
INSTALL_INFO = "/etc/ascend_install.info"
CANN_INSTALL_INFO = "/etc/Ascend/ascend_cann_install.info"
HARDWARE_FILE = "/etc/ascend-lab/hardware.json"
STATE_DIR = "/var/lib/ascend-sim"
RUN_DIR = "/run/ascend-sim"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
DCMI_INIT_FAILED = "dcmi module initialize failed. ret is -8005"
HDK_USER = "HwHiAiUser"


def read_key_values(path):
    """A `key=value` file as a dict; {} when the file is absent."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def write_key_values(path, values):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))


class Node:
    """One node's filesystem: `/` on the node itself, a node root directory on the host."""

    def __init__(self, root="/"):
        self.root = Path(root)

    def path(self, absolute):
        return self.root / str(absolute).lstrip("/")

    # --- driver and firmware -------------------------------------------------

    def hdk_base(self, component):
        """Where the driver or firmware went, from /etc/ascend_install.info like Huawei's tools read it."""
        info = read_key_values(self.path(INSTALL_INFO))
        return info.get(f"{component}_Install_Path_Param", DEFAULT_BASE)

    def driver_dir(self):
        return self.path(self.hdk_base("Driver")) / "driver"

    def firmware_dir(self):
        return self.path(self.hdk_base("Firmware")) / "firmware"

    def installed_driver(self):
        """{'version', 'fw_range'} of the installed driver files, or None."""
        info = read_key_values(self.driver_dir() / "version.info")
        if "Version" not in info:
            return None
        return {"version": info["Version"], "fw_range": parse_range(info["compatible_version_fw"])}

    def installed_firmware(self):
        return read_key_values(self.firmware_dir() / "version.info").get("Version")

    def driver_install_boot_id(self):
        try:
            return self.path(STATE_DIR).joinpath("driver.boot_id").read_text().strip()
        except FileNotFoundError:
            return None

    def boot_id(self):
        return self.path(BOOT_ID_FILE).read_text().strip()

    def driver_reinstalled_this_boot(self):
        return self.driver_install_boot_id() == self.boot_id()

    def loaded(self):
        """What ascend-sim-driver.service loaded at this boot, or None (not run, or from an earlier boot)."""
        try:
            state = json.loads(self.path(RUN_DIR).joinpath("loaded.json").read_text())
        except FileNotFoundError:
            return None
        return state if state["boot_id"] == self.boot_id() else None

    def dcmi_initializes(self):
        """Whether the driver's management library would come up: what npu-smi needs."""
        loaded = self.loaded()
        if loaded is None or self.driver_reinstalled_this_boot():
            return False
        firmware = loaded["firmware_version"]
        return firmware is not None and in_range(firmware, *loaded["fw_range"])

    # --- hardware and devices --------------------------------------------------

    def hardware(self):
        return json.loads(self.path(HARDWARE_FILE).read_text())

    def hbm_advert_dir(self, npu):
        """Where a process holding /dev/davinci<npu> may write its HBM use in MB, one file per pid."""
        return self.path(RUN_DIR) / "hbm" / str(npu)
