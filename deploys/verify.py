"""The verify stage: NPUs healthy, torch_npu imports, model and tokenizer check out, every instance
and the gateway answer."""

from ascend_fleet.stages.checks import verify_stage

verify_stage()
