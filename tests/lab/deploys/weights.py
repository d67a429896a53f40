"""Stage lab/Qwen3-Tiny from the lab mirror onto each worker's NVMe (the weights lab tests).

    pyinfra -y inventories/lab.py tests/lab/deploys/weights.py --limit workers \\
        [--data 'model={"id": "lab/Qwen3-Tiny", "revision": "v2", "source": "http"}']

The model and the mirror are the host's own data (model, model_mirror_url): no key of its own, so
the inventory's check before connecting (fleet_check) reads it as any deploy's.
"""

from pyinfra import host

from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.operations import weights

config = host_node_config(host)
weights.staged(
    name=f"Stage {config.model.id}",
    model_id=config.model.id,
    revision=config.model.revision,
    source=config.model.source,
    url=config.model.url,
    model_dir=config.model_dir,
    # The lab disk is 8 GB: a 1 GiB margin leaves the "too small" test one clear threshold.
    min_free_margin_bytes=1024**3,
)
