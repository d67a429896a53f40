"""The one judgement of an instance and a gateway (ascend_fleet/fleet/probes.py): what verify, the serve
stage's record, the rollout gates and `status` all decide from the same answers."""

from __future__ import annotations

import json

import pytest

from ascend_fleet.core.node_layout import instance_env_file
from ascend_fleet.fleet.probes import (
    EVERY_ASK,
    READ_ONLY_ASKS,
    instance_queries,
    judge_gateway,
    judge_instance,
    running_requests,
)

MODEL = "qwen"
ROOT = "/mnt/nvme/models/Qwen/Qwen3.5-27B/abc123"
METRICS_TEXT = ("# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 1\n')


def answers(**changes: dict) -> dict[str, dict]:
    serving = {"health": {"status": 200, "body": ""},
               "models": {"status": 200, "body": json.dumps({"data": [{"id": MODEL, "root": ROOT}]})},
               "completion": {"status": 200, "body": json.dumps({"choices": [{"text": " hi"}]})},
               "metrics": {"status": 200, "body": METRICS_TEXT}}
    return serving | changes


def test_an_instance_serving_the_model_passes_with_what_it_serves():
    verdict = judge_instance(answers(), MODEL, ROOT)
    assert verdict.ok and (verdict.model, verdict.revision, verdict.metrics.running) == (MODEL, "abc123", 3)


@pytest.mark.parametrize(("changed", "gate", "detail"), [
    ({"health": {"status": 0, "body": ""}}, "health", "/health answers nothing"),
    ({"health": {"status": 503, "body": ""}}, "health", "/health answers 503"),
    ({"models": {"status": 200, "body": json.dumps({"data": [{"id": "other", "root": ROOT}]})}}, "models",
     "/v1/models names ['other'], not qwen"),
    ({"models": {"status": 401, "body": '{"error": "Unauthorized"}'}}, "models", "/v1/models names [], not qwen"),
    ({"completion": {"status": 500, "body": "engine\n dead"}}, "completion", "a completion answers 500: engine dead"),
    ({"metrics": {"status": 200, "body": "up 1\n"}}, "metrics",
     "/metrics answers 200 without vllm:num_requests_running"),
])
def test_the_first_gate_an_instance_fails_is_named_with_what_it_answered(changed, gate, detail):
    verdict = judge_instance(answers(**changed), MODEL)
    assert (verdict.ok, verdict.gate, verdict.detail) == (False, gate, detail)


def test_a_swap_gate_wants_the_new_revision_directory():
    verdict = judge_instance(answers(), MODEL, "/mnt/nvme/models/Qwen/Qwen3.5-27B/next")
    assert (verdict.gate, verdict.detail) == ("models", f"serves {ROOT}, not /mnt/nvme/models/Qwen/Qwen3.5-27B/next")


def test_status_reads_without_a_completion_and_is_judged_on_what_it_asked():
    queries = instance_queries(8000, instance_env_file("vllm-0"), MODEL, READ_ONLY_ASKS)
    assert set(queries) == {"health", "models", "metrics"}
    assert all(q.arguments["url"].startswith("http://127.0.0.1:8000/") and q.arguments["json_body"] is None
               for q in queries.values())
    read = {ask: answer for ask, answer in answers().items() if ask in queries}
    assert judge_instance(read, MODEL).ok


def test_the_completion_is_a_post_of_the_served_model_with_the_instances_key():
    completion = instance_queries(8001, instance_env_file("vllm-1"), MODEL, EVERY_ASK)["completion"]
    assert completion.arguments["url"] == "http://127.0.0.1:8001/v1/completions"
    assert json.loads(completion.arguments["json_body"])["model"] == MODEL
    assert completion.arguments["api_key_file"] == instance_env_file("vllm-1")


def test_running_requests_sum_the_engines_and_an_unanswering_instance_runs_none():
    assert running_requests({"status": 200, "body": METRICS_TEXT}) == 3
    assert running_requests({"status": 0, "body": ""}) == 0


def test_a_gateway_passes_on_a_chat_answer_and_fails_with_its_status_and_body():
    assert judge_gateway({"status": 200, "body": json.dumps({"choices": [{}]})}) is None
    assert judge_gateway({"status": 502, "body": "<html>\n Bad Gateway</html>"}) == \
        "a chat completion answers 502: <html> Bad Gateway</html>"
    assert judge_gateway({"status": 0, "body": "(ConnectionError)"}) == \
        "a chat completion answers nothing: (ConnectionError)"
