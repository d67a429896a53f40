"""The one judgement of "is this instance serving correctly" and "does the gateway answer",
used by the verify stage, the serve stage's record, the rollout gates and `status`.

An instance is asked on its own node (the instance firewall keeps other machines off its
port) with its own key: `instance_queries` says what is asked, `judge_instance` reads the
answers. How the answers are fetched is the caller's: `host.get_fact` in a deploy
(`answers_in_deploy`), `remote.read_fleet_facts` in a rollout or in `status`. The answers are
HttpAnswer values, {"status": 200, "body": "..."}, status 0 when nothing answered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pyinfra import host

from ascend_fleet.core.remote import FactQuery
from ascend_fleet.core.vllm_metrics import RUNNING, InstanceMetrics, parse_metrics
from ascend_fleet.facts.ascend import HttpAnswer, HttpAnswers

PROBE_PROMPT = "Say hello."
HTTP_TIMEOUT_SECONDS = 10
# In the order they are judged: the first that fails names the gate.
HEALTH, MODELS, COMPLETION, METRICS = "health", "models", "completion", "metrics"
EVERY_ASK = (HEALTH, MODELS, COMPLETION, METRICS)
READ_ONLY_ASKS = (HEALTH, MODELS, METRICS)  # no request that generates tokens: `status` reads every few seconds
NO_ANSWER = {"status": 0, "body": ""}


@dataclass(frozen=True)
class InstanceVerdict:
    """What an instance answered and the first gate it fails (None: it serves correctly)."""

    health: int  # /health status code, 0 when nothing answered
    model: str | None = None  # the first model /v1/models lists
    root: str | None = None  # the directory it serves that model from
    metrics: InstanceMetrics | None = None
    gate: str | None = None
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.gate is None

    @property
    def revision(self) -> str | None:
        return Path(self.root).name if self.root else None


def instance_queries(port: int, api_key_file: str, model_name: str, asks: tuple[str, ...] = EVERY_ASK,
                     timeout_seconds: int = HTTP_TIMEOUT_SECONDS) -> dict[str, FactQuery]:
    """{ask: the HttpAnswer query that asks it} for an instance on port, with its key (api_key_file)."""
    path_and_body = {HEALTH: ("/health", None), MODELS: ("/v1/models", None), METRICS: ("/metrics", None),
                     COMPLETION: ("/v1/completions", {"model": model_name, "prompt": PROBE_PROMPT, "max_tokens": 4})}
    return {ask: http_query(port, api_key_file, *path_and_body[ask], timeout_seconds) for ask in asks}


def fact_key(what: str, instance: str) -> str:
    """The name of one instance's fact in a host's reading (remote.read_fleet_facts), for one of
    the asks above or any other fact of the instance (its unit)."""
    return f"{what}:{instance}"


def http_query(port: int, api_key_file: str, path: str, json_body: dict | None,
               timeout_seconds: int = HTTP_TIMEOUT_SECONDS) -> FactQuery:
    """A request (a POST of json_body, else a GET) to a port of the node it is asked on."""
    return FactQuery(HttpAnswer, {"url": f"http://127.0.0.1:{port}{path}",
                                  "json_body": json.dumps(json_body) if json_body else None,
                                  "timeout_seconds": timeout_seconds, "api_key_file": api_key_file})


def answers_in_deploy(queries: Mapping[str, FactQuery]) -> dict[str, dict]:
    """The answers to queries on the host a pyinfra deploy is running on, the HTTP ones in one round trip."""
    http = {name: query.arguments for name, query in queries.items() if query.fact is HttpAnswer}
    answers = dict(zip(http, host.get_fact(HttpAnswers, requests=list(http.values())))) if http else {}
    return {name: answers[name] if name in answers else host.get_fact(query.fact, **query.arguments)
            for name, query in queries.items()}


def json_field(body: str, key: str):
    """body[key] of a JSON object, or None when the body is not one."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document.get(key) if isinstance(document, dict) else None


def judge_instance(answers: Mapping[str, dict], model_name: str, model_path: str | None = None) -> InstanceVerdict:
    """The verdict on one instance from the answers to (some of) its queries: /health 200;
    /v1/models names model_name (and, when model_path is given, serves it from there); a completion
    (if asked); /metrics readable with vLLM's running-requests gauge (if asked)."""
    health = answers.get(HEALTH, NO_ANSWER)["status"]
    if health != 200:
        return InstanceVerdict(health, gate=HEALTH, detail=f"/health answers {health or 'nothing'}")
    cards = json_field(answers.get(MODELS, NO_ANSWER)["body"], "data") or []
    first = cards[0] if cards and isinstance(cards[0], dict) else {}
    seen = InstanceVerdict(health, first.get("id"), first.get("root"))
    card = next((c for c in cards if isinstance(c, dict) and c.get("id") == model_name), None)
    if card is None:
        named = [c.get("id") for c in cards if isinstance(c, dict)]
        return replace(seen, gate=MODELS, detail=f"/v1/models names {named}, not {model_name}")
    seen = replace(seen, model=card.get("id"), root=card.get("root"))
    if model_path and card.get("root") != model_path:
        return replace(seen, gate=MODELS, detail=f"serves {card.get('root')}, not {model_path}")
    if COMPLETION in answers:
        completion = answers[COMPLETION]
        if completion["status"] != 200 or not json_field(completion["body"], "choices"):
            return replace(seen, gate=COMPLETION, detail=f"a completion answers {completion['status'] or 'nothing'}: "
                                                         f"{' '.join(completion['body'].split())[:160]}")
    if METRICS not in answers:
        return seen
    metrics = answers[METRICS]
    try:
        parsed = parse_metrics(metrics["body"] + "\n") if metrics["status"] == 200 else None
    except ValueError as exc:
        return replace(seen, gate=METRICS, detail=f"/metrics unreadable: {exc}")
    if parsed is None or parsed.running is None:
        return replace(seen, gate=METRICS,
                       detail=f"/metrics answers {metrics['status'] or 'nothing'} without {RUNNING[0]}")
    return replace(seen, metrics=parsed)


def answered_metrics(metrics_answer: dict) -> InstanceMetrics | None:
    """An instance's /metrics answer read, or None when it did not answer 200 or its text is not metrics."""
    if metrics_answer["status"] != 200:
        return None
    try:
        return parse_metrics(metrics_answer["body"] + "\n")
    except ValueError:
        return None


def running_requests(metrics_answer: dict) -> int:
    """vLLM's running requests from an instance's /metrics answer; one that does not answer runs nothing."""
    metrics = answered_metrics(metrics_answer)
    return int(metrics.running or 0) if metrics else 0


def prefix_cache_counts(metrics_answer: dict) -> tuple[float, float] | None:
    """(prompt tokens looked up, tokens found) in an instance's prefix cache since it started, from its
    /metrics answer; None when it does not answer or does not report them (an older vLLM)."""
    metrics = answered_metrics(metrics_answer)
    if metrics is None or metrics.prefix_cache_queries is None:
        return None
    return metrics.prefix_cache_queries, metrics.prefix_cache_hits or 0.0


def gateway_chat(model_name: str) -> dict:
    """The chat completion asked through a gateway."""
    return {"model": model_name, "messages": [{"role": "user", "content": PROBE_PROMPT}], "max_tokens": 4}


def judge_gateway(answer: dict) -> str | None:
    """What is wrong with a gateway's answer to gateway_chat, or None when it answered one."""
    if answer["status"] == 200 and json_field(answer["body"], "choices"):
        return None
    return f"a chat completion answers {answer['status'] or 'nothing'}: {' '.join(answer['body'].split())[:160]}"
