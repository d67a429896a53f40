"""What the Ascend runtime sees on a node: the NPU device files and the CANN environment.

Standard library only. wheels.py copies this file into the torch_npu stand-in
(torch_npu/_runtime.py) and the vLLM stand-in (vllm/_sim/runtime.py), so both
see the devices the same way.

ASCEND_SIM_ROOT (tests only) puts a directory in place of "/" for the node
paths below, so tests can fake /dev/davinci*, the hardware file and /run.
"""

import os
import re
from pathlib import Path

DEVICE_PATTERN = re.compile(r"davinci(\d+)")
HARDWARE_FILE = "etc/ascend-lab/hardware.json"
HBM_ADVERT_DIR = "run/ascend-sim/hbm"  # npu-smi reads each holder's HBM use (MB) from <dir>/<npu>/<pid>


def node_path(relative: str) -> Path:
    """A node path, under ASCEND_SIM_ROOT when tests set it."""
    return Path(os.environ.get("ASCEND_SIM_ROOT", "/")) / relative


def device_file(npu: int) -> Path:
    return node_path(f"dev/davinci{npu}")


def present_npus() -> list[int]:
    """Ids of the /dev/davinciN files the simulated driver created, ascending."""
    found = (DEVICE_PATTERN.fullmatch(p.name) for p in node_path("dev").glob("davinci*"))
    return sorted(int(m.group(1)) for m in found if m)


def visible_npus() -> list[int]:
    """Present NPUs, narrowed and ordered by ASCEND_RT_VISIBLE_DEVICES when it is set."""
    present = present_npus()
    listed = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if listed is None:
        return present
    ids = [int(token) for token in listed.split(",") if token.strip()]
    return [npu for npu in ids if npu in present]


def check_cann_environment() -> None:
    """Fail as torch_npu's import does when CANN's set_env.sh was not sourced."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME")
    if not home or not Path(home).is_dir():
        # The real error is the first sentence; the lab's hint after it says which of the two it was.
        found = f"ASCEND_TOOLKIT_HOME={home} is not a directory" if home else "no ASCEND_TOOLKIT_HOME"
        raise ImportError(
            "libhccl.so: cannot open shared object file: No such file or directory "
            f"(CANN environment missing, {found}: source the toolkit's set_env.sh)"
        )
