"""Stand-in for Huawei's torch_npu: registers `torch.npu` over the simulated NPUs.

`torch.npu.device_count()` counts the /dev/davinciN files the simulated driver
created, narrowed by ASCEND_RT_VISIBLE_DEVICES; nothing runs on them. Like the
real package, the import fails when CANN's set_env.sh was not sourced.
"""

import json
import sys
import types

import torch

from torch_npu import _runtime
from torch_npu._version import __version__

_runtime.check_cann_environment()


def device_count() -> int:
    return len(_runtime.visible_npus())


def is_available() -> bool:
    return device_count() > 0


def get_device_name(device: int = 0) -> str:
    hardware = json.loads(_runtime.node_path(_runtime.HARDWARE_FILE).read_text())
    return f"Ascend{hardware['chip']}"


def npu_fusion_attention(*args, **kwargs):
    """Name of the real fused-attention kernel: transformers imports it once torch.npu is available."""
    raise RuntimeError("npu_fusion_attention: the lab's simulated NPUs run no kernels")


npu = types.ModuleType("torch.npu", "Simulated Ascend NPU device module.")
npu.device_count = device_count
npu.is_available = is_available
npu.get_device_name = get_device_name
# Only the module: the real torch_npu also renames torch's privateuse1 backend to "npu", which makes
# it torch's accelerator, and nothing can run on these NPUs. Real vLLM for CPU (the lab's real tier,
# where transformers imports torch_npu once it is installed) would fail in torch.compile.
torch.npu = npu
sys.modules["torch.npu"] = npu

__all__ = ["__version__", "npu", "npu_fusion_attention"]
