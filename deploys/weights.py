"""The weights stage: model weights on the local NVMe, verified, published atomically."""

from ascend_fleet.stages.serving import weights_stage

weights_stage()
