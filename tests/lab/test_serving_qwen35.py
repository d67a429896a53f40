"""Qwen3.5 served the way vllm-ascend's guide serves it (issue 13): the lab's tiny Qwen3.5-MoE W8A8
model through the example fleet's recipe plus expert parallelism (inventories/lab_qwen35.py) on the
vllm-ascend 0.18.0 row, deployed over whatever fleet the other modules of its lab (second_lab)
left behind, as an operator changes a serving fleet's model and recipe."""

from __future__ import annotations

import json
import runpy

import pytest
import requests

from ascend_fleet.core.node_layout import instance_unit
from tests.lab.conftest import INSTANCES, PROJECT, Lab

pytestmark = pytest.mark.lab

RECIPE = runpy.run_path(str(PROJECT / "group_data" / "lab_qwen35.py"))
SERVING = RECIPE["serving"]


@pytest.fixture(scope="module")
def lab(second_lab):
    fleet = second_lab.with_workers(3)
    return Lab(fleet.lab_dir, fleet.name, fleet.subnet, inventory="inventories/lab_qwen35.py")


@pytest.fixture(scope="module")
def deployed(lab):
    return lab.pyinfra("deploys/full.py", timeout=3600)


def serving_argv(lab: Lab, node: str, instance: str) -> list[str]:
    """The running vLLM's own command line, as the kernel has it."""
    out = lab.run(node, f"tr '\\0' '\\n' < /proc/$(systemctl show -P MainPID {instance_unit(instance)})/cmdline").stdout
    return out.splitlines()


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_instance_runs_the_guides_options_and_its_unit_verifies_clean(lab, deployed):
    for node in lab.workers:
        for instance in INSTANCES:
            argv = serving_argv(lab, node, instance)
            assert option(argv, "--quantization") == "ascend", argv
            assert {"--no-enable-prefix-caching", "--enable-expert-parallel", "--async-scheduling"} <= set(argv)
            assert json.loads(option(argv, "--speculative-config")) == SERVING["speculative_config"]
            assert json.loads(option(argv, "--compilation-config")) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
            assert option(argv, "--served-model-name") == RECIPE["model"]["served_model_name"]
            verify = lab.run(node, f"systemd-analyze verify --man=no {instance_unit(instance)} 2>&1", check=False)
            assert verify.returncode == 0 and verify.stdout == "", f"{node} {instance}: {verify.stdout}"


def test_a_chat_completion_through_the_gateway_is_answered_by_the_qwen35_model(lab, deployed):
    gateway = lab.address("gateway")
    name = RECIPE["model"]["served_model_name"]
    reply = requests.post(f"http://{gateway}/v1/chat/completions", timeout=30, json={
        "model": name, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == name and reply.json()["usage"]["completion_tokens"] > 0
    models = requests.get(f"http://{gateway}/v1/models", timeout=30).json()["data"]
    assert models[0]["root"] == f"/mnt/nvme/models/{RECIPE['model']['id']}/{RECIPE['model']['revision']}"


def test_the_plan_shows_the_mtp_draft_and_expert_parallel_layout(lab, deployed):
    plan = json.loads(lab.cli("plan", lab.inventory, "--json").stdout)
    assert plan["verdict"] == "fits" and len(plan["instances"]) == 2 * len(lab.workers)
    for instance in plan["instances"]:
        figures = instance["plan"]
        # Sized by the weights' own quant_model_description.json (W8A8_DYNAMIC), the draft beside them.
        assert (figures["tp"], figures["ep"], figures["quantization"]) == (4, True, "w8a8"), figures
        assert 0 < figures["mtp_weight_bytes_per_npu"] < figures["weight_bytes_per_npu"]
        assert figures["linear_state_bytes_per_sequence_per_npu"] > 0  # the delta-net layers' state
