"""The example production fleet (inventories/prod.py): Qwen2.5-72B-Instruct on 8 x 910B3 nodes."""

profile = "vllm-ascend-0.13.0"

# Pin the revision you validated: weights are never "latest". This is the Hugging Face
# commit of Qwen/Qwen2.5-72B-Instruct; ModelScope keeps its own history, so replace it
# with the ModelScope commit id (model page, "Files", history) before a real rollout.
model = {
    "id": "Qwen/Qwen2.5-72B-Instruct",
    "revision": "495f39366efef23836d0cfae4fbe635880d2be31",
    "source": "modelscope",
}

# Field notes: TP4 per instance (TP8 measured slower on 72B), two instances per 8-NPU node.
tensor_parallel_size = 4

# The handbook's serving options (field notes, section 1.5).
serving = {
    "max_model_len": 32768,
    "gpu_memory_utilization": 0.9,
    "dtype": "float16",
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 64,
}
