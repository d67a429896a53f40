#!/usr/bin/python3
"""Boot-time half of the simulated driver, run by ascend-sim-driver.service (like a kernel module load).

Records the installed driver and firmware as the running ones for this boot, creates
the device stand-ins in /dev (a tmpfs recreated at every boot) from the hardware file, and
applies /etc/hccn.conf to the NPUs' ports (`hccn_tool -a -cfg recovery`): the NPUs forget their
network settings at power-off (the lab resets their ports before each boot), the file keeps them.
"""

import grp
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ascend_sim as sim  # noqa: E402  (installed next to this script)

CONTROL_DEVICES = ("davinci_manager", "devmm_svm", "hisi_hdc")


def create_device(path, gid):
    """A character device with /dev/null's numbers where the container allows mknod, else a plain file."""
    try:
        os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
    except FileExistsError:
        pass
    except PermissionError:
        path.touch()
    os.chown(path, 0, gid)
    path.chmod(0o660)


def main():
    node = sim.Node()
    driver = node.installed_driver()
    if driver is None:
        return 0
    hardware = node.hardware()
    gid = grp.getgrnam(sim.HDK_USER).gr_gid
    names = [f"davinci{n}" for n in range(hardware["npu_count"])] + list(CONTROL_DEVICES)
    for name in names:
        create_device(node.path("/dev") / name, gid)
    for npu in range(hardware["npu_count"]):
        advert_dir = node.hbm_advert_dir(npu)
        advert_dir.mkdir(parents=True, exist_ok=True)
        advert_dir.chmod(0o1777)  # NPU services run as any user; sticky so they only remove their own files
    loaded = {"boot_id": node.boot_id(), "driver_version": driver["version"],
              "fw_range": list(driver["fw_range"]), "firmware_version": node.installed_firmware()}
    node.path(sim.RUN_DIR).joinpath("loaded.json").write_text(json.dumps(loaded) + "\n")
    print(f"ascend-sim: driver {driver['version']} and firmware {loaded['firmware_version']} loaded, "
          f"{hardware['npu_count']} NPUs")
    if hardware["npu_count"] and node.path("/etc/hccn.conf").exists():
        recovery = subprocess.run([str(Path(__file__).resolve().parent / "hccn_tool"), "-a", "-cfg", "recovery"],
                                  capture_output=True, text=True)
        print(f"ascend-sim: /etc/hccn.conf applied: {(recovery.stdout + recovery.stderr).strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
