"""Stage lab/Qwen3-Tiny from the lab mirror onto each worker's NVMe (the weights lab tests).

    pyinfra -y inventories/lab.py tests/lab/deploys/weights.py --limit workers \\
        --data mirror_url=http://10.213.0.1:8080 [--data revision=v2]
"""

from pyinfra import host

from ascend_fleet.operations import weights

weights.staged(
    name="Stage lab/Qwen3-Tiny",
    model_id="lab/Qwen3-Tiny",
    revision=host.data.get("revision", "v1"),
    source="http",
    url=host.data.mirror_url,
    model_dir=f"{host.data.nvme_mount}/models",
    # The lab disk is 8 GB: a 1 GiB margin leaves the "too small" test one clear threshold.
    min_free_margin_bytes=1024**3,
)
