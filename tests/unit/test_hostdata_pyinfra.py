"""Bad data as a real `pyinfra ... deploys/full.py` run prints it: our one line after `pyinfra error:`,
not the file and line of ours that raised it, and the run stops before any operation runs.

The inventory's one host is `@local`, which pyinfra "connects" to without SSH: validation refuses
its data while the deploy file is prepared, so nothing is ever run on it (and the run is --dry).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from ascend_fleet import PROJECT_ROOT

PYINFRA = Path(os.environ.get("VIRTUAL_ENV", PROJECT_ROOT / ".venv")) / "bin" / "pyinfra"
WORKER = {"profile": "lab", "chip": "910B3", "npu_count": 4, "nvme_mount": "/mnt/nvme", "tensor_parallel_size": 4,
          "model": {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "modelscope"},
          "serving": {"max_model_len": 4096, "gpu_memory_utilization": 0.9}}


def full_deploy(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"workers = [('@local', {{**{WORKER!r}, **{data!r}}})]\n")
    return subprocess.run([str(PYINFRA), "-y", "--dry", str(inventory), "deploys/full.py"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("data, line", [
    ({"instances": [{"name": "vllm-0", "npus": [0, 1, 2, 3], "port": 60005, "hccl_base_port": 60000, "vllm_port": 51000}]},
     "@local: instances: vllm-0 port 60005 lies in its own HCCL range 60000-60031; move its port or hccl_base_port "
     "(HCCL takes hccl_base_port and the next 31 ports on profile lab's CANN)"),
    # Two instances 16 apart, as data written for CANN 8.0's 16 ports has them: the lab's CANN 8.5.1 takes 32.
    ({"tensor_parallel_size": 2, "instances": [
        {"name": "vllm-0", "npus": [0, 1], "port": 8000, "hccl_base_port": 60000, "vllm_port": 51000},
        {"name": "vllm-1", "npus": [2, 3], "port": 8001, "hccl_base_port": 60016, "vllm_port": 51016}]},
     "@local: instances: vllm-0 HCCL range 60000-60031 and vllm-1 HCCL range 60016-60047 overlap; move vllm-0's "
     "hccl_base_port or vllm-1's hccl_base_port (HCCL takes hccl_base_port and the next 31 ports on profile lab's CANN)"),
    # The host's validated config refuses it (the stages read the profile's name from there), as `check` does.
    ({"profile": "nosuch"}, "@local: profile: unknown profile 'nosuch'; expected one of: "),
], ids=["api port in its own hccl range", "hccl ranges 16 apart on cann 8.5", "unknown profile"])
def test_a_data_error_stops_the_run_before_any_operation_with_our_line_alone(tmp_path, data, line):
    result = full_deploy(tmp_path, {**data, "fleet_state_dir": str(tmp_path)})
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 1, output
    assert f"--> pyinfra error: {line}" in output
    assert "pyinfra error in" not in output  # `in <file> line <n>`
    assert "--> Beginning operation run" not in output
