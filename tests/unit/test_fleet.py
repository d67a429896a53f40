"""Inventories as pyinfra loads them (offline) and `ascend-fleet plan INVENTORY`: every instance
of every worker, model config from a local path, a local models tree or the lab mirror."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pyinfra.api import Inventory
from typer.testing import CliRunner

from ascend_fleet import PROJECT_ROOT
from ascend_fleet.cli import build_app
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.plan import check_fleet, fleet_node_configs, fleet_roles, load_inventory, plan_fleet
from ascend_fleet.fleet.vllm_serve import vllm_args
from ascend_fleet.lab.spec import LabSpec
from ascend_fleet.lab.state import LabState

MODELS = PROJECT_ROOT / "tests" / "fixtures" / "models"
QWEN25_72B = MODELS / "qwen2.5-72b-instruct"
QWEN35_27B = MODELS / "qwen3.5-27b"
# group_data/prod.py's model, and where a models tree keeps its config.
PROD_MODEL = ("Eco-Tech/Qwen3.5-27B-w8a8-mtp", "master")
PYINFRA = Path(os.environ.get("VIRTUAL_ENV", PROJECT_ROOT / ".venv")) / "bin" / "pyinfra"
runner = CliRunner()


def prod_inventory():
    return load_inventory(PROJECT_ROOT / "inventories" / "prod.py", cwd=PROJECT_ROOT)


def host_data(inventory, name: str) -> dict:
    return inventory.get_host(name).data.dict()


# --- inventories/prod.py with group_data/ ---


def test_prod_inventory_has_the_example_groups():
    inventory = prod_inventory()
    sizes = {group: len(inventory.get_group(group)) for group in ("canary", "wave1", "wave2", "gateway", "prod")}
    assert sizes["canary"] == 1 and sizes["wave1"] >= 1 and sizes["wave2"] >= 1 and 1 <= sizes["gateway"] <= 2
    assert sizes["prod"] == len(inventory)


def test_prod_hosts_verify_ssh_host_keys():
    inventory = prod_inventory()
    for host in inventory:
        data = host.data.dict()
        assert data["ssh_strict_host_key_checking"] == "yes"
        assert Path(data["ssh_known_hosts_file"]).is_absolute() and Path(data["ssh_known_hosts_file"]).is_file()


def test_prod_workers_get_the_guides_qwen3_5_recipe_and_four_instances_each():
    configs = {config.host: config for config in fleet_node_configs(prod_inventory())}
    worker = configs["npu-01.example.internal"]
    assert (worker.profile, worker.chip, worker.npu_count, worker.tensor_parallel_size) == ("vllm-ascend-0.18.0", "910B3", 8, 2)
    assert (worker.model.id, worker.model.revision, worker.model.source) == (*PROD_MODEL, "modelscope")
    assert worker.model.served_model_name == "qwen3.5"
    assert worker.serving.max_model_len == 133000 and worker.npu_env["HCCL_BUFFSIZE"] == "512"
    assert worker.serving.quantization == "ascend" and worker.serving.enable_prefix_caching is False
    assert worker.serving.speculative_config["method"] == "qwen3_5_mtp"
    assert [i.npus for i in worker.instances] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert worker.rollout_waves == ["canary", "wave1", "wave2"] and not worker.is_gateway
    gateway = configs["gw-01.example.internal"]
    assert gateway.is_gateway and gateway.gateway.upstream_name == "vllm_backend" and gateway.instances == []


def test_the_pyinfra_cli_loads_the_prod_inventory_offline():
    result = subprocess.run([str(PYINFRA), "inventories/prod.py", "debug-inventory"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr  # pyinfra logs the inventory on stderr
    assert result.returncode == 0, output
    assert "--> Groups: workers, canary, prod" in output
    assert '"profile": "vllm-ascend-0.18.0"' in output


# --- inventories/lab.py: the lab's hosts get group_data/lab.py and the mirror URLs ---


@pytest.fixture
def lab_dir(tmp_path) -> Path:
    spec = LabSpec.build(3, lab_dir=tmp_path)
    LabState(tmp_path, spec.model_dump(mode="json"), []).save()
    return tmp_path


def test_the_pyinfra_cli_loads_the_lab_inventory_with_lab_data(lab_dir):
    result = subprocess.run([str(PYINFRA), "inventories/lab.py", "debug-inventory"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "ASCEND_FLEET_LAB_DIR": str(lab_dir)})
    output = result.stdout + result.stderr  # pyinfra logs the inventory on stderr
    assert result.returncode == 0, output
    worker1 = output.split("[worker1]")[1].split("\n[")[0]
    assert "--> Groups: workers, canary, lab" in worker1
    for expected in ('"profile": "lab"', '"id": "lab/Qwen3-Tiny"', '"model_mirror_url": "http://10.213.0.1:8080"',
                     '"pip_index_url": "http://10.213.0.1:8080/simple"', '"vendor_mirror_url": "http://10.213.0.1:8080/files"'):
        assert expected in worker1


def test_lab_hosts_validate_as_two_instance_workers_and_a_gateway(lab_dir, monkeypatch):
    monkeypatch.setattr("ascend_fleet.lab.inventory.lab_groups.__defaults__", (lab_dir,))
    configs = {config.host: config for config in fleet_node_configs(load_inventory(PROJECT_ROOT / "inventories" / "lab.py", PROJECT_ROOT))}
    assert configs["gateway"].is_gateway and not configs["gateway"].is_worker
    worker = configs["worker2"]
    assert worker.model.url == "http://10.213.0.1:8080"
    assert len(worker.instances) == 2 and worker.model_dir == "/mnt/nvme/models"


# --- ascend-fleet plan INVENTORY ---


def test_plan_reports_every_instance_of_every_prod_worker():
    result = runner.invoke(build_app(), ["plan", "inventories/prod.py", "--model-config", str(QWEN35_27B), "--json"])
    assert result.exit_code == 0, result.output
    fleet = json.loads(result.output)
    assert fleet["verdict"] == "fits"
    assert len(fleet["instances"]) == 20
    first = fleet["instances"][0]
    assert (first["host"], first["instance"]["name"]) == ("npu-01.example.internal", "vllm-0")
    # Four TP2 instances a node, HCCL ranges 32 apart on the profile's CANN 8.5.1 (they were 16, and overlapped).
    assert [i["hccl_ports"] for i in fleet["instances"][:4]] == [[60000, 60031], [60032, 60063], [60064, 60095],
                                                                 [60096, 60127]]
    # Only the 16 full-attention layers of 64 keep KV: 16 x 4 KV heads x 256 x (K, V) x 2 bytes,
    # and TP2 puts 2 of the 4 KV heads on each NPU.
    assert first["plan"]["kv_cache_bytes_per_token"] == 16 * 4 * 256 * 2 * 2 == 65_536
    assert first["plan"]["kv_cache_bytes_per_token_per_npu"] == 32_768
    assert first["plan"]["mtp_weight_bytes_per_npu"] > 0


def test_plan_of_alike_instances_is_one_row_that_a_pipe_reads_at_80_columns():
    # Before: one row per instance, 12 columns cut to `npu…`, `vll…` in 80 (7.2 s at 4000 rows).
    result = runner.invoke(build_app(), ["plan", "inventories/prod.py", "--model-config", str(QWEN35_27B)],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in result.output
    rows = [line.split() for line in lines if line.strip().startswith("1 ")]
    assert rows == [["1", "20", "TP2", "+", "MTP", "15.1", "1,209,393", "9.01x", "228", "5.0", "fits"]]
    assert ("group 1: 5 hosts (npu-01.example.internal, npu-02.example.internal, npu-03.example.internal and 2 "
            "more), instances vllm-0, vllm-1, vllm-2 and 1 more, HCCL ranges 60000-60031, 60032-60063, 60064-60095 "
            "and 1 more") in " ".join(result.output.split())


def test_plan_limit_keeps_the_instances_of_the_hosts_it_names():
    result = runner.invoke(build_app(), ["plan", "inventories/prod.py", "--model-config", str(QWEN35_27B),
                                         "--limit", "canary", "--limit", "npu-05*", "--json"])
    assert result.exit_code == 0, result.output
    hosts = [instance["host"] for instance in json.loads(result.output)["instances"]]
    assert hosts == ["npu-01.example.internal"] * 4 + ["npu-05.example.internal"] * 4


def test_plan_finds_a_staged_config_in_the_local_models_tree(tmp_path):
    revision = tmp_path.joinpath(*PROD_MODEL[0].split("/"), PROD_MODEL[1])
    revision.mkdir(parents=True)
    (revision / "config.json").write_text((QWEN35_27B / "config.json").read_text())
    plan = plan_fleet(prod_inventory(), models_dir=tmp_path)
    assert plan.verdict == "fits"


def test_with_a_bundle_the_plan_reads_the_config_the_bundle_carries_not_a_mirror_that_may_not_serve_yet(tmp_path):
    bundle = tmp_path / "bundle"
    revision = bundle.joinpath("models", *PROD_MODEL[0].split("/"), PROD_MODEL[1])
    revision.mkdir(parents=True)
    (revision / "config.json").write_text((QWEN35_27B / "config.json").read_text())
    inventory = load_inventory(PROJECT_ROOT / "inventories" / "prod.py", cwd=PROJECT_ROOT, override_data={
        "bundle_dir": str(bundle), "pip_index_url": "http://127.0.0.1:9/simple", "model_mirror_url": "http://127.0.0.1:9"})
    assert plan_fleet(inventory, models_dir=tmp_path / "none").verdict == "fits"


def test_plan_without_any_config_says_where_to_put_one(tmp_path):
    with pytest.raises(FleetError, match=r"^npu-01.example.internal: model Eco-Tech/Qwen3.5-27B-w8a8-mtp@master: "
                                         r"no config.json to plan with; pass --model-config, or put it at "):
        plan_fleet(prod_inventory(), models_dir=tmp_path)


def write_fleet(directory: Path, fleet_data: str, worker_data: str = '{"chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme"}') -> Path:
    """A one-worker fleet `test` in `directory` with its own group_data/test.py."""
    (directory / "group_data").mkdir()
    (directory / "group_data" / "test.py").write_text(fleet_data)
    inventory = directory / "test.py"
    inventory.write_text(f"workers = [('node1', {worker_data})]\ncanary = ['node1']\n")
    return inventory


FLEET = """
profile = {profile!r}
model = {{"id": "Qwen/{model}", "revision": "r1", "source": "hf"}}
tensor_parallel_size = 4
serving = {{"max_model_len": 32768, "gpu_memory_utilization": 0.9, "dtype": "bfloat16", {serving}}}
rollout_waves = ["canary"]
"""


def plan_cli(inventory: Path, config: Path, monkeypatch, *args):
    monkeypatch.chdir(inventory.parent)
    return runner.invoke(build_app(), ["plan", str(inventory), "--model-config", str(config), *args])


def test_plan_refuses_an_instance_that_does_not_fit_naming_host_and_instance(tmp_path, monkeypatch):
    inventory = write_fleet(tmp_path, FLEET.format(profile="vllm-ascend-0.23.0", model="Qwen3.5-397B-A17B", serving=""))
    result = plan_cli(inventory, MODELS / "qwen3.5-397b-a17b", monkeypatch, "--json")
    assert json.loads(result.output)["instances"][0]["verdict"] == "does not fit"
    assert isinstance(result.exception, FleetError)  # the console entry prints it as one line, exit 1
    assert str(result.exception).startswith("node1 instance vllm-0: weights and activations need")


def test_check_fleet_refuses_what_plan_reports_and_passes_what_fits(tmp_path):
    inventory = load_inventory(write_fleet(tmp_path, FLEET.format(profile="vllm-ascend-0.23.0", model="Qwen3.5-397B-A17B", serving="")), tmp_path)
    with pytest.raises(FleetError, match=r"^node1 instance vllm-0: weights and activations need"):
        check_fleet(inventory, MODELS / "qwen3.5-397b-a17b")
    assert check_fleet(inventory, MODELS / "qwen3.5-27b").verdict in ("fits", "tight")


def test_the_handbook_profile_warns_that_it_matches_no_upstream_row(tmp_path, monkeypatch):
    inventory = write_fleet(tmp_path, FLEET.format(profile="handbook", model="Qwen2.5-72B-Instruct", serving=""))
    result = plan_cli(inventory, QWEN25_72B, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "warning: profile handbook matches no upstream vllm-ascend row" in " ".join(result.output.split())


def test_a_profile_too_old_for_the_model_is_refused_by_preflights_plan(tmp_path):
    inventory = load_inventory(write_fleet(tmp_path, FLEET.format(profile="vllm-ascend-0.13.0", model="Qwen3.5-27B", serving="")), tmp_path)
    with pytest.raises(FleetError) as refused:
        check_fleet(inventory, MODELS / "qwen3.5-27b")
    assert str(refused.value) == ("node1 instance vllm-0: Qwen/Qwen3.5-27B (model_type 'qwen3_5') is served from "
                                  "vllm-ascend 0.17.0rc1 on, profile vllm-ascend-0.13.0 pins 0.13.0; choose a newer profile")


def test_qwen3_5_on_the_0_18_0_profile_is_not_refused_for_its_transformers(tmp_path, monkeypatch):
    """vLLM 0.18.0 brings its own Qwen3.5 config and requires transformers < 5: the profile's 4.57.6
    serves it, where a check of transformers alone (first knows qwen3_5 in 5.2.0) refused it."""
    inventory = write_fleet(tmp_path, FLEET.format(profile="vllm-ascend-0.18.0", model="Qwen3.5-27B", serving=""))
    result = plan_cli(inventory, MODELS / "qwen3.5-27b", monkeypatch, "--json")
    assert result.exception is None, result.output
    codes = {finding["code"] for finding in json.loads(result.output)["instances"][0]["findings"]}
    assert not codes & {"vllm-ascend-too-old", "transformers-too-old"}, codes


def test_block_size_and_vllm_use_v1_are_warned_about(tmp_path):
    fleet = FLEET.format(profile="vllm-ascend-0.13.0", model="Qwen2.5-72B-Instruct",
                         serving='"block_size": 32, "enable_prefix_caching": True') + 'npu_env = {"VLLM_USE_V1": 1}\n'
    plan = check_fleet(load_inventory(write_fleet(tmp_path, fleet), tmp_path), QWEN25_72B)
    codes = {finding.code for report in plan.instances for finding in report.findings}
    assert {"block-size-overridden", "vllm-use-v1-obsolete"} <= codes


def test_bad_host_data_stops_the_plan_before_any_model_is_read(tmp_path):
    inventory = load_inventory(write_fleet(tmp_path, FLEET.format(profile="lab", model="x", serving=""),
                                           '{"chip": "910B3", "npu_count": 4, "nvme_mount": "/mnt/nvme", "tensor_parallel_size": 3}'), tmp_path)
    with pytest.raises(FleetError, match=r"^node1: tensor_parallel_size: 3 does not divide npu_count 4"):
        plan_fleet(inventory, tmp_path / "never-read.json")


def test_a_worker_in_no_rollout_wave_is_refused(tmp_path):
    fleet = FLEET.format(profile="lab", model="x", serving="").replace('["canary"]', '["wave1", "wave2"]')
    with pytest.raises(FleetError, match=r"^node1: rollout_waves: the host is in none of wave1, wave2; add it"):
        fleet_node_configs(load_inventory(write_fleet(tmp_path, fleet), tmp_path))


# --- the weights' own scheme: msModelSlim's quant_model_description.json ---


def described_model(directory: Path, quant_type: str) -> Path:
    """Qwen3.5-27B's config.json with a description of vllm-ascend's own tests' shape
    (tests/ut/quantization/conftest_quantization.py: version, model_quant_type, a tensor each)."""
    directory.mkdir()
    (directory / "config.json").write_text((QWEN35_27B / "config.json").read_text())
    (directory / "quant_model_description.json").write_text(json.dumps({
        "version": "1.0.0", "model_quant_type": quant_type, "model.embed_tokens.weight": "FLOAT",
        "model.layers.0.mlp.gate_proj.weight": quant_type}))
    return directory


def ascend_fleet_plan(directory: Path, scheme: str | None, model_config: Path):
    directory.mkdir()
    serving = '"quantization": "ascend"' + (f', "quantization_scheme": "{scheme}"' if scheme else "")
    inventory = write_fleet(directory, FLEET.format(profile="vllm-ascend-0.18.0", model="Qwen3.5-27B", serving=serving))
    return plan_fleet(load_inventory(inventory, directory), model_config=model_config)


def test_the_weights_description_decides_the_scheme_and_data_that_says_otherwise_is_warned(tmp_path):
    w4a8 = described_model(tmp_path / "w4a8", "W4A8_DYNAMIC")
    said = ascend_fleet_plan(tmp_path / "said", "w4a8", QWEN35_27B).instances[0]
    described = ascend_fleet_plan(tmp_path / "described", "w8a8", w4a8).instances[0]
    assert (said.plan.quantization, described.plan.quantization) == ("w4a8", "w4a8")
    assert described.plan.weight_bytes_per_npu == said.plan.weight_bytes_per_npu
    assert [f.message for f in described.findings if f.severity == "warning" and "differs" in f.message] == [
        "quantization_scheme w8a8 differs from the weights' quant_model_description.json (w4a8): planned with "
        "the weights'"]
    w8a8 = ascend_fleet_plan(tmp_path / "w8a8", "w8a8", QWEN35_27B).instances[0]
    assert w8a8.plan.weight_bytes_per_npu > described.plan.weight_bytes_per_npu  # 1 byte a weight, not 0.5


def test_ascend_weights_need_a_description_or_a_scheme_in_the_data(tmp_path):
    unknown = ascend_fleet_plan(tmp_path / "neither", None, QWEN35_27B)
    # Said as what it most likely is: bf16 weights, which vllm-ascend refuses to serve with --quantization ascend.
    assert unknown.first_error() == (
        "node1 instance vllm-0: quantization ascend, but no quant_model_description.json is beside the model's "
        "config: weights without one are not msModelSlim's and vllm-ascend refuses to start; drop quantization, or, "
        "if the weights have it and the plan reads only their config, set quantization_scheme to their scheme "
        "(w8a8, w4a8; the serve stage checks the file on the node)")
    described = ascend_fleet_plan(tmp_path / "described", None, described_model(tmp_path / "w8a8", "W8A8"))
    assert described.first_error() is None and described.instances[0].plan.quantization == "w8a8"


def test_a_description_whose_scheme_the_planner_cannot_size_is_refused_naming_it(tmp_path):
    model = described_model(tmp_path / "flat", "W4A4_FLATQUANT_DYNAMIC")
    with pytest.raises(FleetError, match=r"^node1: model Qwen/Qwen3.5-27B@r1: quant_model_description.json: "
                                         r"model_quant_type 'W4A4_FLATQUANT_DYNAMIC' is none the planner sizes"):
        ascend_fleet_plan(tmp_path / "plan", "w4a8", model)
    result = runner.invoke(build_app(), ["plan", "--model-config", str(described_model(tmp_path / "one", "W4A8_DYNAMIC")),
                                         "--tp", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["quantization"] == "w4a8"


@pytest.fixture
def mirror(tmp_path):
    """An HTTP mirror serving models/<org>/<name>/<revision>/config.json, like the lab's."""
    revision = tmp_path / "mirror" / "models" / "lab" / "Qwen3-Tiny" / "v1"
    revision.mkdir(parents=True)
    (revision / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 512, "vocab_size": 2048,
        "max_position_embeddings": 4096, "tie_word_embeddings": False}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "mirror")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_lab_plan_reads_the_model_config_from_the_lab_mirror(tmp_path, mirror):
    # An inventory named lab.py gets the real group_data/lab.py, as inventories/lab.py does.
    inventory = tmp_path / "lab.py"
    worker = {"chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme", "model_mirror_url": mirror}
    inventory.write_text(f"workers = [('worker1', {worker!r})]\ncanary = ['worker1']\nwave1 = []\nwave2 = []\n")
    plan = check_fleet(load_inventory(inventory, PROJECT_ROOT))
    assert [report.instance.name for report in plan.instances] == ["vllm-0", "vllm-1"]
    assert all(report.plan.model_type == "qwen3" for report in plan.instances)


@pytest.mark.parametrize("serving, flags", [
    ("", []),  # vLLM's own defaults: nothing said
    ('"enable_prefix_caching": True, "enable_chunked_prefill": True', ["--enable-prefix-caching", "--enable-chunked-prefill"]),
    # Off must be said: vLLM turns both on by default, and the Qwen3.5 recipes pass --no-enable-prefix-caching.
    ('"enable_prefix_caching": False, "enable_chunked_prefill": False',
     ["--no-enable-prefix-caching", "--no-enable-chunked-prefill"]),
])
def test_prefix_caching_and_chunked_prefill_reach_vllm_on_and_off(tmp_path, serving, flags):
    inventory = load_inventory(write_fleet(tmp_path, FLEET.format(profile="vllm-ascend-0.13.0",
                                                                  model="Qwen2.5-72B-Instruct", serving=serving)), tmp_path)
    config = next(c for c in fleet_node_configs(inventory) if c.is_worker)
    args = vllm_args(config, config.instances[0], "/mnt/nvme/models/x", "0.13.0")
    assert [a for a in args if "prefix-caching" in a or "chunked-prefill" in a] == flags


def test_a_block_size_is_kept_only_with_both_turned_off(tmp_path):
    def findings(serving: str) -> set[str]:
        fleet = FLEET.format(profile="vllm-ascend-0.13.0", model="Qwen2.5-72B-Instruct", serving=serving)
        directory = tmp_path / str(len(serving))
        directory.mkdir()
        plan = check_fleet(load_inventory(write_fleet(directory, fleet), directory), QWEN25_72B)
        return {finding.code for report in plan.instances for finding in report.findings}
    assert "block-size-overridden" in findings('"block_size": 32')  # the defaults turn both on
    assert "block-size-overridden" not in findings(
        '"block_size": 32, "enable_prefix_caching": False, "enable_chunked_prefill": False')


def test_plan_of_one_model_config_refuses_a_profile_too_old_for_it():
    config = MODELS / "qwen3.5-27b"
    refused = runner.invoke(build_app(), ["plan", "--model-config", str(config), "--tp", "2", "--profile", "vllm-ascend-0.13.0"])
    assert isinstance(refused.exception, FleetError)
    assert str(refused.exception) == (f"does not fit: {config} (model_type 'qwen3_5') is served from vllm-ascend "
                                      "0.17.0rc1 on, profile vllm-ascend-0.13.0 pins 0.13.0; choose a newer profile")
    served = runner.invoke(build_app(), ["plan", "--model-config", str(config), "--tp", "2", "--profile", "vllm-ascend-0.18.0"])
    assert served.exception is None, served.output


# --- the fleet's NPU network plan (hccn_tool addresses, TLS, peers) ---


def npu_fleet(directory: Path, hosts: dict[str, dict], groups: str = "") -> Inventory:
    """Workers node1.. with the given NPU network data each, all in the canary wave."""
    (directory / "group_data").mkdir()
    (directory / "group_data" / "test.py").write_text(FLEET.format(profile="lab", model="x", serving=""))
    workers = [(name, {"chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme", **data})
               for name, data in hosts.items()]
    inventory = directory / "test.py"
    inventory.write_text(f"workers = {workers!r}\ncanary = {list(hosts)!r}\n{groups}")
    return load_inventory(inventory, directory)


def npu_plan(first: int, subnet: str = "10.20.0", **more) -> dict:
    return {"npu_addresses": [f"{subnet}.{first + npu}" for npu in range(8)], "npu_netmask": "255.255.255.0", **more}


def test_a_fleet_whose_npu_network_plan_holds_together_is_accepted(tmp_path):
    inventory = npu_fleet(tmp_path, {"node1": npu_plan(11, npu_peer_group="pair"), "node2": npu_plan(21, npu_peer_group="pair")},
                          "pair = ['node1', 'node2']\n")
    assert [config.host for config in fleet_node_configs(inventory)] == ["node1", "node2"]


@pytest.mark.parametrize("hosts, groups, expected", [
    ({"node1": npu_plan(11), "node2": npu_plan(18)}, "",
     "node2: npu_addresses: NPU 0's 10.20.0.18 is node1's NPU 7 too; expected each NPU address once in the fleet"),
    ({"node1": npu_plan(11), "node2": npu_plan(21, npu_tls=True)}, "",
     "node2: npu_tls: True but node1's is False; every NPU of the fleet must have the same TLS switch"),
    ({"node1": npu_plan(11, npu_peer_group="pair"), "node2": {}}, "pair = ['node1', 'node2']\n",
     "node1: npu_peer_group pair: node2 has no npu_addresses; plan its NPU network too"),
    ({"node1": npu_plan(11, npu_peer_group="pair"), "node2": npu_plan(11, "10.20.1")}, "pair = ['node1', 'node2']\n",
     "node1: npu_peer_group pair: node2's NPUs are in 10.20.1.0/24, outside 10.20.0.0/24, and npu_gateway is not set"),
    ({"node1": npu_plan(11, npu_peer_group="pair"), "node2": npu_plan(21)}, "pair = ['node2']\n",
     "node1: npu_peer_group: pair is not an inventory group holding this host"),
], ids=["address twice", "tls differs", "peer without plan", "peer unreachable", "not in its group"])
def test_an_npu_network_plan_that_cannot_work_is_refused_in_one_line(tmp_path, hosts, groups, expected):
    with pytest.raises(FleetError) as caught:
        fleet_node_configs(npu_fleet(tmp_path, hosts, groups))
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_the_multi_node_lab_serves_two_instances_over_two_workers_each(tmp_path, monkeypatch):
    """inventories/lab_multinode.py on a lab of 4 workers: two TP8 x DP2 instances, heads worker1 and
    worker3, every member with its NPU network plan on the lab's parameter plane."""
    LabState(tmp_path, LabSpec.build(4, lab_dir=tmp_path).model_dump(mode="json"), []).save()
    monkeypatch.setattr("ascend_fleet.lab.inventory.lab_groups.__defaults__", (tmp_path,))
    inventory = load_inventory(PROJECT_ROOT / "inventories" / "lab_multinode.py", PROJECT_ROOT)
    configs = {config.host: config for config in fleet_node_configs(inventory)}
    roles = fleet_roles(inventory)
    assert {host: (role.head, role.start_rank, role.size) for host, role in roles.items()} == {
        "worker1": ("worker1", 0, 2), "worker2": ("worker1", 1, 2), "worker3": ("worker3", 0, 2),
        "worker4": ("worker3", 1, 2)}
    assert [len(configs[worker].instances[0].npus) for worker in roles] == [8] * 4
    assert configs["worker2"].instance_env(configs["worker2"].instances[0])["HCCL_IF_IP"] == "10.213.0.12"


def test_the_deploys_capacity_gate_counts_a_releases_extra_kv_cache_copies_as_plan_does(tmp_path):
    """Issue #5020's case (Qwen3-Next-80B-A3B, TP4, 4096 tokens, 0.85): vllm-ascend 0.13.0's model runner holds a
    hybrid model's KV cache twice and ran out of memory; 0.18.0 shares it. One answer for `plan` and preflight."""
    def checked(profile: str):
        fleet = FLEET.format(profile=profile, model="Qwen3-Next-80B-A3B-Instruct", serving="").replace(
            '"max_model_len": 32768, "gpu_memory_utilization": 0.9', '"max_model_len": 4096, "gpu_memory_utilization": 0.85')
        (tmp_path / profile).mkdir()
        inventory = write_fleet(tmp_path / profile, fleet)
        return plan_fleet(load_inventory(inventory, tmp_path / profile), model_config=MODELS / "qwen3-next-80b-a3b")

    error = checked("vllm-ascend-0.13.0").first_error()
    assert error is not None and "allocates a hybrid model's KV cache 2 times" in error, error
    assert checked("vllm-ascend-0.18.0").first_error() is None
