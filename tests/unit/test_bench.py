"""bench: SLOs as a user writes them, the vllm command line, the tokenizer fetched from the model's
mirror without its weights, and the verdict a run gets."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console

from ascend_fleet.config.hostdata import node_config
from ascend_fleet.control.bench import BenchOptions, Target, bench_command, fetch_tokenizer, judge, parse_slo, render
from ascend_fleet.core.errors import FleetError

WORKER = {"profile": "lab", "chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme", "tensor_parallel_size": 4,
          "serving": {"max_model_len": 2048, "gpu_memory_utilization": 0.9},
          "model": {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "http", "url": "http://127.0.0.1:1"}}


def test_slo_limits_are_p99_unless_a_statistic_is_named():
    assert parse_slo("ttft_ms=2000,tpot_ms=50") == {"p99_ttft_ms": 2000, "p99_tpot_ms": 50}
    assert parse_slo("mean_itl_ms=40, median_e2el_ms=900") == {"mean_itl_ms": 40, "median_e2el_ms": 900}
    for bad in ("ttft=2000", "throughput_ms=3", "ttft_ms=fast", "ttft_ms=-1"):
        with pytest.raises(FleetError, match="expected METRIC_ms=LIMIT"):
            parse_slo(bad)


def test_a_run_fails_the_slo_it_exceeds():
    verdicts = judge({"p99_ttft_ms": 2500.0, "p99_tpot_ms": 20.0}, {"p99_ttft_ms": 2000, "p99_tpot_ms": 50})
    assert [(v["metric"], v["passed"]) for v in verdicts] == [("p99_ttft_ms", False), ("p99_tpot_ms", True)]
    assert judge({}, {"p99_itl_ms": 50})[0]["passed"] is False  # not measured is not passed


def target(**overrides) -> Target:
    config = node_config({**WORKER, **overrides}, "worker1")
    return Target("inventories/lab.py", "gateway", "http://10.0.0.1:80", config, 6, [])


def test_command_goes_through_the_gateway_with_the_served_model_name(tmp_path):
    command = bench_command(Path("/venv"), target(), "/tok", tmp_path, "r.json",
                            BenchOptions(num_prompts=8, request_rate=float("inf"), max_concurrency=4, input_len=64,
                                         output_len=16))
    assert command[:3] == ["/venv/bin/vllm", "bench", "serve"]
    options = dict(zip(command[3::2], command[4::2]))
    assert options["--base-url"] == "http://10.0.0.1:80" and options["--model"] == "lab/Qwen3-Tiny"
    assert options["--request-rate"] == "inf" and options["--max-concurrency"] == "4"
    assert "--ignore-eos" in command and "--dataset-path" not in command
    sharegpt = bench_command(Path("/venv"), target(), "/tok", tmp_path, "r.json",
                             BenchOptions(dataset="sharegpt", dataset_path="/data/sg.json", num_prompts=8,
                                          request_rate=10, input_len=64, output_len=16))
    assert "--ignore-eos" not in sharegpt and "--random-input-len" not in sharegpt and "/data/sg.json" in sharegpt


@pytest.fixture()
def model_mirror(tmp_path):
    """A mirror serving models/lab/Qwen3-Tiny/v1/ with its manifest, on 127.0.0.1."""
    root = tmp_path / "mirror"
    model = root / "models" / "lab" / "Qwen3-Tiny" / "v1"
    model.mkdir(parents=True)
    contents = {"config.json": b"{}", "tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b"{}",
                "model-00001-of-00001.safetensors": b"\0" * 64}
    for name, data in contents.items():
        (model / name).write_bytes(data)
    manifest = {"model_id": "lab/Qwen3-Tiny", "revision": "v1",
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in contents.items()}}
    (model / "ascend-fleet-manifest.json").write_text(json.dumps(manifest))
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_tokenizer_is_every_file_but_the_weights_checked_against_the_manifest(tmp_path, model_mirror):
    config = node_config({**WORKER, "model": {**WORKER["model"], "url": model_mirror}}, "worker1")
    directory = fetch_tokenizer(config, tmp_path / "cache")
    assert directory == tmp_path / "cache" / "tokenizers" / "lab" / "Qwen3-Tiny" / "v1"
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    (directory / "tokenizer.json").write_text('{"model": {"x": 1}}')  # a corrupt copy is refused, not used
    with pytest.raises(FleetError, match="tokenizer file .* delete it and rerun"):
        fetch_tokenizer(config, tmp_path / "cache")


def test_table_shows_the_change_against_a_previous_run():
    run = {"model": {"id": "lab/Qwen3-Tiny", "revision": "v1"}, "profile": {"name": "lab"}, "instances": 6,
           "gateway": {"url": "http://gw"}}
    result = {"completed": 8, "failed": 0, "output_throughput": 120.0, "p99_ttft_ms": 50.0, "ascend_fleet": run}
    console = Console(width=200, record=True)
    console.print(render(result, {"completed": 8, "failed": 0, "output_throughput": 100.0, "p99_ttft_ms": 100.0}))
    text = console.export_text()
    assert "+20.0%" in text and "-50.0%" in text and "lab/Qwen3-Tiny@v1" in text


def test_a_result_keeps_its_load_so_a_later_run_sends_the_same(tmp_path):
    options = BenchOptions(num_prompts=24, request_rate=float("inf"), max_concurrency=8, input_len=64, output_len=32)
    result = {"ascend_fleet": {"bench": {**options.to_dict(), "command": ["vllm", "bench", "serve"]}}}
    assert BenchOptions.of_result(json.loads(json.dumps(result)), tmp_path / "b.json") == options
    with pytest.raises(FleetError, match="no ascend_fleet.control.bench section; make the baseline with `ascend-fleet bench`"):
        BenchOptions.of_result({"completed": 3}, tmp_path / "b.json")


def test_a_bench_gate_names_each_metric_that_regressed_past_the_threshold():
    from ascend_fleet.control.bench import parse_share, regressions

    baseline = {"failed": 0, "output_throughput": 400.0, "p99_ttft_ms": 100.0, "p99_tpot_ms": 20.0,
                "request_goodput": None}
    same = {**baseline, "output_throughput": 390.0, "p99_tpot_ms": 20.5}
    halved = {**baseline, "output_throughput": 200.0, "p99_ttft_ms": 400.0}
    assert regressions(baseline, same, 0.05) == []
    assert regressions(baseline, halved, 0.05) == [
        "output_throughput 400 -> 200 (-50.0%, past the 5% allowed)",
        "p99_ttft_ms 100 -> 400 (+300.0%, past the 5% allowed)"]
    assert regressions(baseline, {**same, "failed": 2}, 0.05) == ["failed requests 0 -> 2"]
    assert parse_share("5%") == parse_share("0.05") == 0.05
    with pytest.raises(FleetError, match="expected a share such as 5%"):
        parse_share("five")



# A command that needs the bench virtualenv, with pip's few minutes and 3.4 GB stood in for: the build
# leaves the files the check reads and notes itself in builds.log.
NEEDS_BENCH_VENV = """
import sys, time
from pathlib import Path
from ascend_fleet.control import bench

def build(venv, find_links):
    with open(sys.argv[1], "a") as log:
        log.write(f"{venv}\\n")
    time.sleep(1)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").touch()
    (venv / bench.SETUP_MARKER).write_text(bench.setup_marker_text())

bench._build_bench_venv = build
bench.ensure_bench_venv(sys.argv[2])
"""


def test_the_first_run_that_needs_the_bench_virtualenv_builds_it_once_and_says_so(tmp_path):
    venv, builds = tmp_path / "bench-venv", tmp_path / "builds.log"
    env = {**os.environ, "ASCEND_FLEET_BENCH_VENV": str(venv)}

    def start(command: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", NEEDS_BENCH_VENV, str(builds), command], env=env,
                                stderr=subprocess.PIPE, text=True)

    # Two started at once (e.g. two pytest processes): the second waits for the first one's build.
    first, second = start("tune"), start("tune")
    notes = [process.communicate(timeout=60)[1] for process in (first, second)]
    assert builds.read_text() == f"{venv}\n"
    assert all(f"tune: first run: building the bench virtualenv at {venv}" in note for note in notes)
    assert start("bench").communicate(timeout=60)[1] == ""
    assert builds.read_text() == f"{venv}\n"


def test_with_a_bundle_the_tokenizer_comes_from_it_not_from_a_mirror_out_of_reach(tmp_path, model_mirror):
    """An offline site behind a bastion: its mirror serves the bundle on the gateway, which this machine does not
    reach (the users' site lab: 'cannot read http://…:8070/models/… No route to host'); the bundle is here."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tmp_path / "mirror" / "models", bundle / "models")
    config = node_config({**WORKER, "bundle_dir": str(bundle), "pip_index_url": "http://127.0.0.1:9/simple",
                          "model": {**WORKER["model"], "url": "http://127.0.0.1:9"}}, "worker1")
    carried = bundle / "models" / "lab" / "Qwen3-Tiny" / "v1"
    assert fetch_tokenizer(config, tmp_path / "cache") == carried
    assert not (tmp_path / "cache").exists()
    (carried / "tokenizer.json").write_text('{"model": {"x": 1}}')
    with pytest.raises(FleetError, match="tokenizer file .*tokenizer.json .*bundle verify"):
        fetch_tokenizer(config, tmp_path / "cache")
