"""The multi-node lab (inventories/lab_multinode.py): the lab's tiny model of Qwen3.5-397B-A17B's shape,
W8A8, served as vllm-ascend's two-node guide serves the real one (v0.18.0's
docs/source/tutorials/models/Qwen3.5-397B-A17B.md, "Multi-node Deployment with MP"): TP8 on each
worker, DP2 across two, expert parallel, MTP, prefix caching off, FULL_DECODE_ONLY, taken from the example
fleet's recipe (group_data/prod_397b.py); only the context and the batched tokens are the lab's own.
"""

import runpy
from pathlib import Path

__all__ = ["profile", "model", "tensor_parallel_size", "npu_env", "serving", "monitoring", "gateway_fail_timeout"]

_lab = runpy.run_path(str(Path(__file__).with_name("lab.py")))
_recipe = runpy.run_path(str(Path(__file__).with_name("prod_397b.py")))  # the guide's, as the example fleet has it

profile = _lab["profile"]  # vllm-ascend 0.18.0's row

model = {"id": "lab/Qwen3.5-Tiny-397B-Shape-W8A8", "revision": "v1", "source": "http",
         "served_model_name": _recipe["model"]["served_model_name"]}

tensor_parallel_size = _recipe["tensor_parallel_size"]

# The guide's exports for both nodes (HCCL_IF_IP and the *_SOCKET_IFNAME come from data_parallel).
npu_env = _recipe["npu_env"]

# The tiny model knows 4096 positions; its weights' own description sizes it (no quantization_scheme).
serving = {**{key: value for key, value in _recipe["serving"].items() if key != "quantization_scheme"},
           "max_model_len": 2048, "max_num_batched_tokens": 2048}

monitoring = _lab["monitoring"]
gateway_fail_timeout = _lab["gateway_fail_timeout"]
