"""The rehearsal lab on Qwen3.5 (inventories/lab_qwen35.py): the lab's tiny Qwen3.5-MoE W8A8 model
(hybrid delta-net layers, experts, an MTP layer, msModelSlim's files) served with the example
fleet's recipe (group_data/prod.py, vllm-ascend's Atlas A2 guide) and expert parallelism, as the
guide serves its MoE sizes; only what the tiny model and the lab's 8 NPUs need is changed.
"""

import runpy
from pathlib import Path

__all__ = ["profile", "model", "tensor_parallel_size", "npu_env", "serving", "monitoring", "gateway_fail_timeout"]

_lab = runpy.run_path(str(Path(__file__).with_name("lab.py")))
_prod = runpy.run_path(str(Path(__file__).with_name("prod.py")))

profile = _lab["profile"]  # vllm-ascend 0.18.0's row, as the real fleet's profile

model = {"id": "lab/Qwen3.5-Tiny-A1B-W8A8", "revision": "v1", "source": "http",
         "served_model_name": _prod["model"]["served_model_name"]}

# TP4 (two instances per 8-NPU worker), experts spread over the instance's 4 NPUs.
tensor_parallel_size = _lab["tensor_parallel_size"]
npu_env = _prod["npu_env"]

# The tiny model knows 4096 positions; the lab's batch limits are its own.
serving = {**_prod["serving"], "enable_expert_parallel": True,
           **{key: _lab["serving"][key] for key in ("max_model_len", "max_num_batched_tokens", "max_num_seqs")}}

monitoring = _lab["monitoring"]
gateway_fail_timeout = _lab["gateway_fail_timeout"]
