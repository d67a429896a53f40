"""The simulated vLLM server, run from its built wheel on 127.0.0.1 against a fake node root.

No root and no lab: ASCEND_SIM_ROOT points the server at a temporary directory
holding dev/davinci0..3, etc/ascend-lab/hardware.json and run/ascend-sim.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from safetensors.numpy import save_file

from ascend_fleet.config.profile import available_profiles, load_profile
from ascend_fleet.core.vllm_metrics import parse_metrics
from ascend_fleet.lab.sim.tinymodel import build_tiny_qwen35_moe
from ascend_fleet.lab.sim.wheels import OPTIONS_DIR, build_standin_wheels
from ascend_fleet.sizing.planner import MODELSLIM_DESCRIPTION

VLLM_VERSION = "0.13.0"
CANN_VERSION = "8.5.0"  # vllm-ascend 0.13.0's (profile vllm-ascend-0.13.0): its HCCL takes 32 ports
HCCL_PORT_SPAN = 32
NPU_COUNT = 4
LOAD_SECONDS = 1.5
# A bound for a start, not a speed target: CI runs these beside two parts with labs on two busy cores,
# where a start of Python and FastAPI has taken over 30 s (the CI rehearsal of 2026-12-07).
STARTUP_TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Below the kernel's ephemeral ports (32768-60999 by default): a range chosen there can be taken by any
# outgoing connection on this machine before the server binds it, as the labs' SSH sessions did in CI.
HCCL_PORTS = range(22000, 32700, 97)
VLLM_PORTS = range(12000, 21900, 11)


def free_port_range(count: int = HCCL_PORT_SPAN, bases: range = HCCL_PORTS) -> int:
    """A base port of `bases` whose next `count` ports are all free right now, tried in random order so that
    servers made one after another, before either binds, get ranges apart."""
    for base in random.sample(bases, len(bases)):
        try:
            held = []
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no free port range")


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    """The stand-in wheels unpacked into a directory put on PYTHONPATH (a venv install, minus pip)."""
    wheels = build_standin_wheels(
        {"torch_npu": "2.8.0.post2", "vllm_ascend": VLLM_VERSION, "vllm": VLLM_VERSION},
        tmp_path_factory.mktemp("wheels"),
    )
    site = tmp_path_factory.mktemp("site")
    for wheel in wheels:
        zipfile.ZipFile(wheel).extractall(site)
    return site


@pytest.fixture(scope="module")
def node_root(tmp_path_factory) -> Path:
    return make_node_root(tmp_path_factory.mktemp("node"))


def make_node_root(root: Path, cann: str = CANN_VERSION) -> Path:
    """dev/davinciN, the lab's hardware file, the simulator's run directory and a CANN home under root
    with its toolkit's install record (whose release the simulated HCCL takes its port span from)."""
    (root / "dev").mkdir()
    for npu in range(NPU_COUNT):
        (root / "dev" / f"davinci{npu}").touch()
    (root / "etc/ascend-lab").mkdir(parents=True)
    hardware = {
        "node": "worker1",
        "role": "worker",
        "chip": "910B3",
        "npu_count": NPU_COUNT,
        "hbm_mb": 65536,
        "npu_health": ["OK"] * NPU_COUNT,
    }
    (root / "etc/ascend-lab/hardware.json").write_text(json.dumps(hardware))
    (root / "run/ascend-sim").mkdir(parents=True)
    (root / "cann/x86_64-linux").mkdir(parents=True)
    (root / "cann/x86_64-linux/ascend_toolkit_install.info").write_text(
        f"package_name=Ascend-cann-toolkit\nversion={cann}\narch=x86_64\nos=linux\n")
    return root


def write_model(path: Path) -> Path:
    """A tiny Qwen3-shaped checkpoint: config.json, one safetensors shard and its index."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 2048,
        "torch_dtype": "float16",
    }
    (path / "config.json").write_text(json.dumps(config))
    tensors = {
        "model.embed_tokens.weight": np.zeros((256, 64), np.float16),
        "model.layers.0.mlp.up_proj.weight": np.ones((128, 64), np.float16),
    }
    shard = "model-00001-of-00001.safetensors"
    save_file(tensors, str(path / shard))
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
        "weight_map": dict.fromkeys(tensors, shard),
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "tiny")


class SimServer:
    """One simulated vLLM process with its own NPUs, HCCL range and ports."""

    def __init__(self, site: Path, root: Path, log: Path, npus: str, args: list[str], env: dict | None = None,
                 entry: str = "serve"):
        """entry: "serve" (`vllm serve`) or "api_server" (`python -m vllm.entrypoints.openai.api_server`)."""
        self.port = free_port()
        # vLLM scans up from VLLM_PORT for its internal ports (the DP master's among them): ten left free
        self.vllm_port = free_port_range(10, VLLM_PORTS)
        self.hccl_base = free_port_range()
        self.log = log
        base_env = {
            **os.environ,
            "PYTHONPATH": str(site),
            "ASCEND_SIM_ROOT": str(root),
            "ASCEND_TOOLKIT_HOME": str(root / "cann"),
            "ASCEND_RT_VISIBLE_DEVICES": npus,
            "HCCL_IF_IP": "127.0.0.1",
            "HCCL_IF_BASE_PORT": str(self.hccl_base),
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_PORT": str(self.vllm_port),
            "VLLM_SIM_LOAD_BASE_SECONDS": str(LOAD_SECONDS),
            "VLLM_SIM_ITL_SECONDS": "0.02",
        }
        command = [
            sys.executable,
            "-m",
            *(["vllm.entrypoints.cli.main", "serve"] if entry == "serve" else ["vllm.entrypoints.openai.api_server"]),
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                command, env={**base_env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT
            )

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def get(self, path: str, headers: dict | None = None) -> tuple[int, bytes]:
        conn = self.connection()
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()

    def post(self, path: str, body: dict) -> http.client.HTTPResponse:
        conn = self.connection()
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return conn.getresponse()

    def health_statuses(self) -> list[int]:
        """/health answers from start until 200, each distinct answer once."""
        seen: list[int] = []
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                status, _ = self.get("/health")
            except OSError:
                time.sleep(0.05)
                continue
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            time.sleep(0.05)
        raise AssertionError(f"server never became healthy: {seen}\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=STARTUP_TIMEOUT)

    def kill(self) -> None:
        """Make sure a failed test leaves no server behind."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def run_to_exit(
    site: Path, root: Path, tmp_path: Path, npus: str, args: list[str], env: dict | None = None
) -> tuple[int, str]:
    server = SimServer(site, root, tmp_path / "refused.log", npus, args, env)
    try:
        return server.process.wait(timeout=STARTUP_TIMEOUT), server.output()
    finally:
        server.kill()


@pytest.fixture(scope="module")
def serving(site_dir, node_root, model_dir, tmp_path_factory):
    """A server on NPUs 0,1 (TP 2) and the /health answers it gave while starting."""
    log = tmp_path_factory.mktemp("logs") / "serving.log"
    server = SimServer(
        site_dir,
        node_root,
        log,
        "0,1",
        [str(model_dir), "-tp", "2", "--served-model-name", "tiny", "--max-model-len", "2048"],
    )
    statuses = server.health_statuses()
    yield server, statuses
    server.stop()


def sse_events(response: http.client.HTTPResponse) -> list[str]:
    """The data fields of a server-sent event stream, in order."""
    return [line[len(b"data: ") :].decode() for line in response.read().splitlines() if line.startswith(b"data: ")]


def test_unknown_option_is_rejected_like_argparse(site_dir, node_root, model_dir, tmp_path):
    code, output = run_to_exit(site_dir, node_root, tmp_path, "0", [str(model_dir), "--no-such-option", "1"])
    assert code == 2
    assert "vllm serve: error: unrecognized arguments: --no-such-option" in output


def test_option_of_a_later_release_is_rejected(site_dir, node_root, model_dir, tmp_path):
    pinned = json.loads((OPTIONS_DIR / f"{VLLM_VERSION}.json").read_text())
    later = json.loads((OPTIONS_DIR / "0.32.0.json").read_text())

    def flags(data):
        return {f for action in data["serve"]["actions"] for f in action["flags"] if f.startswith("--")}

    newer_option = sorted(flags(later) - flags(pinned))[0]
    code, output = run_to_exit(site_dir, node_root, tmp_path, "0", [str(model_dir), newer_option, "1"])
    assert code == 2
    assert f"unrecognized arguments: {newer_option}" in output


def test_health_is_503_while_loading_then_200(serving):
    server, statuses = serving
    assert statuses == [503, 200]
    output = server.output()
    assert "GPU KV cache size: " in output and "Maximum concurrency for 2,048 tokens per request: " in output


def test_models_lists_the_served_name(serving):
    server, _ = serving
    status, body = server.get("/v1/models")
    assert status == 200
    assert [card["id"] for card in json.loads(body)["data"]] == ["tiny"]


def test_streaming_chat_sends_chunks_usage_and_done(serving):
    server, _ = serving
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    response = server.post("/v1/chat/completions", request)
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]][1:]
    assert len(content) == 8 and content[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def test_same_prompt_gives_same_text(serving):
    server, _ = serving
    request = {"model": "tiny", "prompt": "Ascend", "max_tokens": 6, "ignore_eos": True}
    texts = [json.loads(server.post("/v1/completions", request).read())["choices"][0]["text"] for _ in range(2)]
    assert texts[0] == texts[1] and texts[0]


def test_the_model_generates_from_the_weights_it_read_at_start(site_dir, node_root, model_dir, tmp_path):
    """vLLM reads every tensor when it starts (docs/sim-fidelity.md): a byte flipped in a shard afterwards
    changes nothing until a restart, which then answers otherwise; the right bytes answer as before."""
    model = shutil.copytree(model_dir, tmp_path / "tiny")
    shard = model / "model-00001-of-00001.safetensors"
    request = {"model": "tiny", "prompt": "Ascend", "max_tokens": 12, "ignore_eos": True}

    def started() -> SimServer:
        server = SimServer(site_dir, node_root, tmp_path / "weights.log", "3", [str(model), "--served-model-name",
                                                                              "tiny", "--max-model-len", "2048"])
        server.health_statuses()
        return server

    def text(server: SimServer) -> str:
        return json.loads(server.post("/v1/completions", request).read())["choices"][0]["text"]

    right = shard.read_bytes()
    flipped = bytearray(right)
    flipped[-1] ^= 0xFF  # in the last tensor's data, not the header
    server = started()
    try:
        before = text(server)
        shard.write_bytes(bytes(flipped))
        assert text(server) == before  # read at start: the running server does not see it
    finally:
        server.stop()
    for content, same in ((bytes(flipped), False), (right, True)):
        shard.write_bytes(content)
        server = started()
        try:
            assert (text(server) == before) is same
        finally:
            server.stop()


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_CHOICE_REFUSAL = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def test_tools_chosen_auto_without_a_tool_parser_are_refused_as_real_vllm_refuses_them(serving):
    """Issue 28: what the official client's tools=[...] (tool_choice "auto", said or not) gets from an
    instance started without --enable-auto-tool-choice and --tool-call-parser."""
    server, _ = serving
    for choice in ({"tool_choice": "auto"}, {}):
        reply = server.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 4, "tools": TOOLS, **choice,
                                                     "messages": [{"role": "user", "content": "Weather in Paris?"}]})
        assert (reply.status, json.loads(reply.read())["error"]["message"]) == (400, TOOL_CHOICE_REFUSAL), choice
    reply = server.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 4, "tools": TOOLS,
                                                 "tool_choice": "none",
                                                 "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    assert reply.status == 200, reply.read()


def test_unknown_model_is_404(serving):
    server, _ = serving
    response = server.post("/v1/completions", {"model": "other", "prompt": "x"})
    assert response.status == 404
    assert "The model `other` does not exist." in response.read().decode()


def test_tokenize_counts_prompt_tokens(serving):
    server, _ = serving
    body = json.loads(server.post("/tokenize", {"prompt": "abc"}).read())
    assert body["count"] == 3 and body["max_model_len"] == 2048


def test_metrics_parse_with_current_names(serving):
    server, _ = serving
    server.post("/v1/completions", {"model": "tiny", "prompt": "metrics", "max_tokens": 3}).read()
    status, body = server.get("/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    expected = {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    }
    assert expected <= set(families)
    for name in expected:
        assert all(s.labels["model_name"] == "tiny" for s in families[name].samples)
    generated = [
        s.value for s in families["vllm:generation_tokens"].samples if s.name == "vllm:generation_tokens_total"
    ]
    assert generated[0] >= 3


def test_npu_held_by_another_instance_is_refused(serving, site_dir, node_root, model_dir, tmp_path):
    server, _ = serving
    code, output = run_to_exit(site_dir, node_root, tmp_path, "1,2", [str(model_dir), "-tp", "2"])
    assert code == 1
    assert f"NPU 1 ({node_root}/dev/davinci1) is already in use by process {server.process.pid}" in output


def test_taken_hccl_port_range_is_refused(site_dir, node_root, model_dir, tmp_path):
    """The last of CANN 8.5's 32 ports taken: HCCL binds its whole range, so the start fails there."""
    base = free_port_range()
    last = base + HCCL_PORT_SPAN - 1
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", last))
        squatter.listen()
        code, output = run_to_exit(site_dir, node_root, tmp_path, "3", [str(model_dir)], {"HCCL_IF_BASE_PORT": str(base)})
    assert code == 1
    assert "EJ0003" in output and "Failed to bind the IP port" in output and f"port[{last}]" in output
    assert f"HCCL range {base}-{last} from HCCL_IF_BASE_PORT, 32 ports on CANN {CANN_VERSION}" in output


def test_an_instance_16_ports_above_a_running_ones_hccl_base_is_refused_on_cann_8_5(serving, site_dir, node_root,
                                                                                    model_dir, tmp_path):
    """Instances spaced 16 apart, as the product placed them for every CANN: on CANN 8.5 the second one's
    range starts inside the first one's 32, and it fails at its first port as a bind clash does."""
    server, _ = serving
    second = server.hccl_base + 16
    code, output = run_to_exit(site_dir, node_root, tmp_path, "3", [str(model_dir)], {"HCCL_IF_BASE_PORT": str(second)})
    assert code == 1
    assert "EJ0003" in output and f"port[{second}]" in output, output[-2000:]


def test_cann_8_0s_hccl_takes_16_ports(site_dir, model_dir, tmp_path):
    """On CANN 8.0 (the handbook's 8.0.RC2) HCCL takes 16 ports: a listener on the 17th is no clash."""
    (tmp_path / "node-8.0").mkdir()
    root = make_node_root(tmp_path / "node-8.0", cann="8.0.RC2")
    base = free_port_range()
    with socket.socket() as neighbour:
        neighbour.bind(("127.0.0.1", base + 16))
        neighbour.listen()
        server = SimServer(site_dir, root, tmp_path / "cann-8.0.log", "0", [str(model_dir)],
                           {"HCCL_IF_BASE_PORT": str(base)})
        try:
            assert server.health_statuses()[-1] == 200
        finally:
            server.kill()


def test_without_a_toolkit_record_the_simulated_hccl_does_not_start(site_dir, node_root, model_dir, tmp_path):
    (tmp_path / "empty-cann").mkdir()
    code, output = run_to_exit(site_dir, node_root, tmp_path, "3", [str(model_dir)],
                               {"ASCEND_TOOLKIT_HOME": str(tmp_path / "empty-cann")})
    assert code == 1
    assert f"no CANN toolkit record under ASCEND_TOOLKIT_HOME={tmp_path / 'empty-cann'}" in output


def test_every_shipped_profiles_hccl_span_is_what_the_simulated_hccl_of_its_cann_takes(site_dir):
    """The profile's span is the product's claim; the simulated HCCL's comes from its CANN's release."""
    profiles = {name: load_profile(name).stack for name in available_profiles()}
    script = ("import json, sys; from vllm._sim.claims import hccl_port_span; "
              "print(json.dumps({n: hccl_port_span(c) for n, c in json.loads(sys.argv[1]).items()}))")
    taken = subprocess.run([sys.executable, "-c", script, json.dumps({n: s.cann for n, s in profiles.items()})],
                           env={**os.environ, "PYTHONPATH": str(site_dir)}, capture_output=True, text=True, check=True)
    assert json.loads(taken.stdout) == {name: stack.hccl_port_span for name, stack in profiles.items()}


def test_missing_shard_fails_clearly(site_dir, node_root, tmp_path):
    model = write_model(tmp_path / "broken")
    (model / "model-00001-of-00001.safetensors").unlink()
    code, output = run_to_exit(site_dir, node_root, tmp_path, "3", [str(model)])
    assert code == 1
    assert "weight shard model-00001-of-00001.safetensors named in model.safetensors.index.json is missing" in output


def test_corrupt_safetensors_header_fails_clearly(site_dir, node_root, tmp_path):
    model = write_model(tmp_path / "corrupt")
    shard = model / "model-00001-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:12])
    code, output = run_to_exit(site_dir, node_root, tmp_path, "3", [str(model)])
    assert code == 1
    assert f"corrupt safetensors file {shard}" in output


def test_sigterm_finishes_the_in_flight_stream_and_exits_0(site_dir, node_root, model_dir, tmp_path):
    server = SimServer(
        site_dir,
        node_root,
        tmp_path / "sigterm.log",
        "2,3",
        [str(model_dir), "-tp", "2"],
        {"VLLM_SIM_LOAD_BASE_SECONDS": "0.2"},
    )
    try:
        server.health_statuses()
        response = server.post(
            "/v1/completions", {"prompt": "drain me", "max_tokens": 40, "stream": True, "ignore_eos": True}
        )
        assert response.readline().startswith(b"data: ")  # the stream is under way
        server.process.send_signal(signal.SIGTERM)
        events = sse_events(response)
        assert events[-1] == "[DONE]"
        assert len(events) == 40  # 39 more token chunks + [DONE]
        assert server.process.wait(timeout=STARTUP_TIMEOUT) == 0
    finally:
        server.kill()


def test_api_key_from_the_environment_guards_v1_only(site_dir, node_root, model_dir, tmp_path):
    """As real vLLM: with VLLM_API_KEY set, /v1 needs the Bearer key; /health and /metrics stay open."""
    server = SimServer(site_dir, node_root, tmp_path / "key.log", "2,3", [str(model_dir), "-tp", "2"],
                       {"VLLM_SIM_LOAD_BASE_SECONDS": "0.2", "VLLM_API_KEY": "s3cret-key"})
    try:
        server.health_statuses()
        assert server.get("/v1/models") == (401, b'{"error":"Unauthorized"}')
        assert server.get("/v1/models", {"Authorization": "Bearer wrong-key"})[0] == 401
        assert server.get("/v1/models", {"Authorization": "Bearer s3cret-key"})[0] == 200
        assert server.get("/metrics")[0] == 200
    finally:
        server.kill()
    assert "s3cret-key" not in server.output()


def test_a_data_parallel_instance_on_0_13_never_gets_past_picking_its_master_ports(site_dir, node_root, model_dir,
                                                                                   tmp_path):
    """vLLM 0.13.0 with VLLM_PORT set (as every instance's is): get_open_ports_list(5) loops for ever."""
    server = SimServer(site_dir, node_root, tmp_path / "dp.log", "0", [str(model_dir), "--data-parallel-size", "2",
                       "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
                       "--data-parallel-rpc-port", str(free_port())])
    try:
        time.sleep(3)
        assert server.process.poll() is None and "Started DP Coordinator" not in server.output()
    finally:
        server.kill()


# --- Qwen3.5 on the vllm-ascend 0.18.0 row, served with its guide's options ---

QWEN35_STACK = {"torch_npu": "2.9.0", "vllm_ascend": "0.18.0", "vllm": "0.18.0"}
QWEN35_RECIPE = ["-tp", "4", "--enable-expert-parallel", "--quantization", "ascend", "--no-enable-prefix-caching",
                 "--async-scheduling", "--speculative-config", '{"method": "qwen3_5_mtp", "num_speculative_tokens": 3}',
                 "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}', "--max-model-len", "2048",
                 "--served-model-name", "qwen3.5",
                 # group_data/prod.py's tool calling and reasoning, from vLLM's Qwen3.5 recipe
                 "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3"]


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The 0.18.0 stand-ins unpacked, a node of its own and the tiny Qwen3.5-MoE W8A8 model."""
    site = tmp_path_factory.mktemp("site-0.18.0")
    for wheel in build_standin_wheels(QWEN35_STACK, tmp_path_factory.mktemp("wheels-0.18.0")):
        zipfile.ZipFile(wheel).extractall(site)
    model = build_tiny_qwen35_moe(tmp_path_factory.mktemp("models") / "qwen3.5")
    return site, make_node_root(tmp_path_factory.mktemp("node-0.18.0")), model


def test_the_tiny_qwen35_w8a8_model_serves_with_the_guides_recipe(qwen35, tmp_path):
    site, root, model = qwen35
    server = SimServer(site, root, tmp_path / "qwen35.log", "0,1,2,3", [str(model), *QWEN35_RECIPE])
    try:
        assert server.health_statuses()[-1] == 200
        reply = server.post("/v1/chat/completions", {"model": "qwen3.5", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status == 200 and json.loads(reply.read())["usage"]["completion_tokens"] == 4
        reply = server.post("/v1/chat/completions", {"model": "qwen3.5", "max_tokens": 4, "tools": TOOLS,
                                                     "tool_choice": "auto",
                                                     "messages": [{"role": "user", "content": "Weather in Paris?"}]})
        assert reply.status == 200 and json.loads(reply.read())["choices"][0]["message"]["content"]
    finally:
        assert server.stop() == 0, server.output()


def test_ascend_quantization_of_weights_without_their_description_fails_as_vllm_ascend_0_18_does(qwen35, tmp_path):
    site, root, model = qwen35
    plain = tmp_path / "unquantized"
    shutil.copytree(model, plain)
    (plain / MODELSLIM_DESCRIPTION).unlink()
    code, output = run_to_exit(site, root, tmp_path, "0,1,2,3", [str(plain), *QWEN35_RECIPE])
    assert code == 1
    assert "ModelSlim Quantization Config Not Found" in output and f"the model '{plain}' does not contain" in output


@pytest.mark.parametrize("args, message", [
    (["--no-enable-chunked-prefill", "--max-model-len", "1024", "--max-num-batched-tokens", "512"],
     "ValueError: max_num_batched_tokens (512) is smaller than max_model_len (1024). This effectively limits the "
     "maximum sequence length to max_num_batched_tokens"),
    (["--max-num-batched-tokens", "64", "--max-num-seqs", "128"],
     "ValueError: max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)."),
    (["--speculative-config", '{"method":"qwen3_5_mpt","num_speculative_tokens":1}'],
     "1 validation error for SpeculativeConfig method: Input should be 'ngram', 'medusa', "),
], ids=["batch below the context", "batch below the seats", "unknown speculative method"])
def test_options_vllm_refuses_together_stop_the_start_as_vllm_does(site_dir, node_root, model_dir, tmp_path, args,
                                                                   message):
    code, output = run_to_exit(site_dir, node_root, tmp_path, "3", [str(model_dir), *args])
    assert code == 1 and message in output, output[-2000:]


# A system prompt two chats share: 1,407 tokens (the tiny model has no tokenizer: a token a byte), so
# eleven full 128-token blocks of each prompt come before its question
SYSTEM_PROMPT = "You answer questions about the fleet's Ascend 910B nodes, briefly. " * 21
QUESTIONS = ("How many NPUs has a node?", "What does HCCL carry?")


@pytest.fixture(scope="module")
def performance_root(tmp_path_factory) -> Path:
    """A node whose hardware file times each engine step as Qwen2.5-72B's on four 910B3s, in real time
    (performance.py), so that what a prefill skips shows in the time to the first token."""
    root = make_node_root(tmp_path_factory.mktemp("performance-node"))
    hardware = json.loads((root / "etc/ascend-lab/hardware.json").read_text())
    models = Path(__file__).resolve().parents[1] / "fixtures" / "models"
    hardware["performance"] = {"time_scale": 1.0,
                               "performs_as": json.loads((models / "qwen2.5-72b-instruct/config.json").read_text())}
    (root / "etc/ascend-lab/hardware.json").write_text(json.dumps(hardware))
    return root


def shared_prefix_chats(site: Path, root: Path, model: Path, log: Path, *options: str) -> list[dict]:
    """Two streamed chats in turn under SYSTEM_PROMPT on a TP4 server started with `options`: each one's
    time to its first token, its prompt tokens and the prefix cache counters on /metrics after it."""
    server = SimServer(site, root, log, "0,1,2,3", [str(model), "-tp", "4", "--served-model-name", "tiny",
                                                     "--max-model-len", "2048", *options],
                       {"VLLM_SIM_LOAD_BASE_SECONDS": "0.2"})
    try:
        server.health_statuses()
        chats = []
        for question in QUESTIONS:
            started, first_token, usage = time.monotonic(), None, None
            response = server.post("/v1/chat/completions", {
                "model": "tiny", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]})
            for line in response:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[len(b"data: "):])
                if first_token is None and any(choice["delta"].get("content") for choice in event["choices"]):
                    first_token = time.monotonic() - started
                usage = event.get("usage") or usage
            metrics = parse_metrics(server.get("/metrics")[1].decode())
            chats.append({"ttft": first_token, "prompt_tokens": usage["prompt_tokens"],
                          "queries": metrics.prefix_cache_queries, "hits": metrics.prefix_cache_hits})
        return chats
    finally:
        assert server.stop() == 0, server.output()


def test_a_second_chat_under_the_same_long_system_prompt_hits_the_prefix_cache_and_starts_sooner(
        site_dir, performance_root, model_dir, tmp_path):
    # prefix caching on by default; --block-size 8 has no effect, as vllm-ascend forces 128 while it is on
    first, second = shared_prefix_chats(site_dir, performance_root, model_dir, tmp_path / "prefix-caching.log",
                                        "--block-size", "8")
    print(f"\nprefix caching on (default): {first}\n{second}")
    assert (first["queries"], first["hits"]) == (first["prompt_tokens"], 0)  # looked up, nothing cached yet
    shared = len(f"system: {SYSTEM_PROMPT}\nuser: ")
    assert second["queries"] == first["prompt_tokens"] + second["prompt_tokens"]
    assert second["hits"] == shared // 128 * 128 == 1408 != shared // 8 * 8  # the shared prefix's full blocks
    assert second["ttft"] < first["ttft"] / 2  # its prefill skipped those blocks


def test_with_no_enable_prefix_caching_the_counters_stay_zero_and_both_prefill_everything(
        site_dir, performance_root, model_dir, tmp_path):
    first, second = shared_prefix_chats(site_dir, performance_root, model_dir, tmp_path / "no-prefix-caching.log",
                                        "--no-enable-prefix-caching")
    print(f"\nprefix caching off: {first}\n{second}")
    # exposed all the same, as vLLM registers them whatever the option, and never counted
    assert [(chat["queries"], chat["hits"]) for chat in (first, second)] == [(0, 0), (0, 0)]
    assert second["ttft"] > first["ttft"] / 2
