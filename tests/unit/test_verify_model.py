"""Verify's model check: the pinned vLLM must be able to read the model's config, which for Qwen3.5
on vLLM 0.17.0 and later does not need a transformers that knows the type (vLLM brings its config
class), and the tokenizer must reproduce the manifest's probe. The node's answer is the probe's
line; what it prints is the probe's own code, run on a lab node by tests/lab/test_serving_qwen35.py."""

from __future__ import annotations

import pytest

from ascend_fleet.config.hostdata import Model, NodeConfig
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import MANIFEST_NAME
from ascend_fleet.stages import checks

MODEL = Model(id="lab/Qwen3.5-Tiny-A1B-W8A8", revision="v1", source="http", url="http://10.213.0.1:8080")
CONFIG = NodeConfig(host="worker1", profile="lab", model_dir="/mnt/nvme/models", model=MODEL)


class ProbeAnswer:
    """A host whose serving venv prints `line` for the model probe."""

    def __init__(self, line: str):
        self.line = line

    def get_fact(self, fact, **kwargs):
        assert fact is checks.VenvPython and kwargs["code"] == checks.MODEL_PROBE.format(
            path="/mnt/nvme/models/lab/Qwen3.5-Tiny-A1B-W8A8/v1", manifest=MANIFEST_NAME)
        return {"ok": True, "output": self.line}


@pytest.mark.parametrize(("profile", "line", "problem"), [
    # transformers 4.57.6 does not know qwen3_5_moe; vLLM 0.18.0 reads it with its own class.
    ("lab", "qwen3_5_moe config-unknown probe-ok", None),
    # vLLM 0.11.0 brings no Qwen3.5 config: nothing on that node can read the model.
    ("lab-previous", "qwen3_5_moe config-unknown probe-ok",
     "transformers 4.57.1 does not know model_type 'qwen3_5_moe' of /mnt/nvme/models/lab/Qwen3.5-Tiny-A1B-W8A8/v1, "
     "and vLLM 0.11.0 brings no config for it; check the profile's transformers version"),
    ("lab", "qwen3 config-known probe-ok", None),
    ("lab", "qwen3 config-known probe-mismatch",
     "the tokenizer at /mnt/nvme/models/lab/Qwen3.5-Tiny-A1B-W8A8/v1 does not reproduce the manifest's probe ids; "
     "restage the weights"),
])
def test_the_model_is_judged_readable_as_the_pinned_vllm_reads_it(monkeypatch, profile, line, problem):
    monkeypatch.setattr(checks, "host", ProbeAnswer(line))
    assert checks.model_problem(CONFIG, load_profile(profile)) == problem
