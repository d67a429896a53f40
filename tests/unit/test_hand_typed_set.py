"""A set of hand-typed mistakes across issue 49's classes, each run as the user would meet it, every host unreachable
(the example fleet's names resolve nowhere; the firewall's and keepalived's resolver is given their addresses): an
inventory, its host or group data through `ascend-fleet check`, or a command's arguments. Each is either refused
before anything connects, in one line naming the key or option and the value, exit 2 ("refused"), or taken because
vLLM, CANN or the tool take it as meant ("taken"). None may end in a traceback."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from ascend_fleet import PROJECT_ROOT
from ascend_fleet.cli import build_app
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import FIREWALL_UNIT
from tests.unit.test_fleet_check import UNFILLED_SHA256, resolving  # noqa: F401  (a fixture)

PROD = "group_data/prod.py"
INVENTORY = "inventories/prod.py"
ALL = "group_data/all.py"
GATEWAY = "group_data/gateway.py"


@dataclass(frozen=True)
class Mistake:
    """One mistake: a change to the example fleet's files (file, old, new) checked with `ascend-fleet check`, or a
    command line; what it ends in, and a piece of the one line it is refused with."""

    edit: tuple[str, str, str] | None = None
    argv: tuple[str, ...] = ()
    outcome: str = "refused"  # or "taken", or "connects": taken, and stopped by the unreachable hosts
    says: str = ""


SERVING = '"max_num_seqs": 32,'
MISTAKES = {
    # --- host and group data: the model and its names ---
    "revision with a trailing blank": Mistake((PROD, '"revision": "master"', '"revision": "master "'),
                                              says="model 'Eco-Tech/Qwen3.5-27B-w8a8-mtp@master ' (a trailing blank): no config.json"),
    "model id with a full-width slash": Mistake((PROD, '"Eco-Tech/Qwen3.5', '"Eco-Tech\uff0fQwen3.5'),
                                                says="model.id: String should match pattern"),
    "served name with a blank": Mistake((PROD, '"served_model_name": "qwen3.5"', '"served_model_name": "qwen 3.5"'),
                                        says="model.served_model_name: expected one word"),
    "source in capitals": Mistake((PROD, '"source": "modelscope"', '"source": "ModelScope"'), says="model.source:"),
    "revision a branch path": Mistake((PROD, '"revision": "master"', '"revision": "refs/pr/1"'),
                                      says="model.revision: expected one path segment"),
    # --- sizes, counts and numbers ---
    "tp that does not divide 8": Mistake((PROD, "tensor_parallel_size = 2", "tensor_parallel_size = 3"),
                                         says="tensor_parallel_size: 3 does not divide npu_count 8"),
    "tp as a string of digits": Mistake((PROD, "tensor_parallel_size = 2", 'tensor_parallel_size = "2"'),
                                        outcome="taken"),
    "context as 128k": Mistake((PROD, '"max_model_len": 133000', '"max_model_len": "128k"'),
                               says="serving.max_model_len: Input should be a valid integer"),
    "memory share as a percentage": Mistake((PROD, '"gpu_memory_utilization": 0.9', '"gpu_memory_utilization": 90'),
                                            says="serving.gpu_memory_utilization: Input should be less than or equal to 1"),
    "nan memory share": Mistake((PROD, '"gpu_memory_utilization": 0.9', '"gpu_memory_utilization": float("nan")'),
                                says="serving.gpu_memory_utilization: Input should be a finite number (got nan)"),
    "1e309 seats": Mistake((PROD, '"max_num_seqs": 32', '"max_num_seqs": 1e309'),
                           says="serving.max_num_seqs: Input should be a finite number (got inf)"),
    "negative seats": Mistake((PROD, '"max_num_seqs": 32', '"max_num_seqs": -1'),
                              says="serving.max_num_seqs: Input should be greater than 0"),
    "npu count of 16 on one node": Mistake((INVENTORY, '"npu_count": 8', '"npu_count": 16'), outcome="taken"),
    "chip in lower case": Mistake((INVENTORY, '"chip": "910B3"', '"chip": "910b3"'), says="chip: Input should be"),
    "max_unavailable 0": Mistake((ALL, 'service_user = "vllm"', 'service_user = "vllm"\nmax_unavailable = 0'),
                                 says="max_unavailable: Input should be greater than or equal to 1"),
    "reboot timeout as 15m": Mistake((ALL, 'service_user = "vllm"', 'service_user = "vllm"\nreboot_timeout = "15m"'),
                                     says="reboot_timeout: Input should be a valid integer"),
    # --- options as vLLM types them ---
    "an option and its value as one word": Mistake((PROD, '"--seed", "1024"', '"--seed 1024"'),
                                                   says="vLLM 0.18.0 has no option --seed 1024"),
    "-O3 (vLLM's shorthand)": Mistake((PROD, '"--seed", "1024"', '"--seed", "1024", "-O3"'), outcome="taken"),
    "-O 4": Mistake((PROD, '"--seed", "1024"', '"--seed", "1024", "-O", "4"'), says="has no option -O"),
    "a level vLLM has not": Mistake((PROD, '"--seed", "1024"', '"--seed", "1024", "-O9"'),
                                    says="-O9 (vLLM reads --optimization-level): '9': vLLM 0.18.0's "
                                         "VllmConfig.optimization_level takes one of 0, 1, 2, 3"),
    "a switch given a value": Mistake((PROD, '"--trust-remote-code"', '"--trust-remote-code=true"'),
                                      says="--trust-remote-code takes no value"),
    "a serving key again in extra_args": Mistake((PROD, '"--seed", "1024"', '"--seed", "1024", "--max-model-len", "4k"'),
                                                 says="--max-model-len sets max_model_len, which ascend-fleet sets"),
    "an int key as a float": Mistake((PROD, '"num_speculative_tokens": 3', '"num_speculative_tokens": 3.5'),
                                     says="serving.speculative_config.num_speculative_tokens: 3.5"),
    "a cudagraph mode in lower case": Mistake((PROD, '"FULL_DECODE_ONLY"', '"full_decode_only"'), outcome="taken"),
    "inf in additional_config": Mistake((PROD, '{"enable_cpu_binding": True}', '{"x": float("inf")}'),
                                        says="serving.additional_config: x: inf is no number JSON holds"),
    # --- npu_env as the env file and CANN read it ---
    "connect timeout below CANN's 120": Mistake((PROD, '"HCCL_BUFFSIZE": 512,', '"HCCL_BUFFSIZE": 512, '
                                                 '"HCCL_CONNECT_TIMEOUT": 60,'),
                                                says="npu_env: HCCL_CONNECT_TIMEOUT='60': "),
    "buffer size with its unit": Mistake((PROD, '"HCCL_BUFFSIZE": 512', '"HCCL_BUFFSIZE": "512MB"'),
                                         says="npu_env: HCCL_BUFFSIZE='512MB': "),
    "an env switch as True": Mistake((PROD, '"TASK_QUEUE_ENABLE": 1', '"TASK_QUEUE_ENABLE": True'),
                                     says="npu_env.TASK_QUEUE_ENABLE: Input should be a valid string"),
    "RDMA timeout past A2's 20": Mistake((PROD, '"HCCL_BUFFSIZE": 512,', '"HCCL_BUFFSIZE": 512, '
                                          '"HCCL_RDMA_TIMEOUT": 24,'), says="npu_env: HCCL_RDMA_TIMEOUT='24': "),
    # --- addresses, ports, names ---
    "virtual address without a prefix": Mistake((PROD, '"10.20.0.100/24"', '"10.20.0.100"'), outcome="taken"),
    "virtual address the network's": Mistake((PROD, '"10.20.0.100/24"', '"10.20.0.0/24"'),
                                             says="gateway_vip.address: 10.20.0.0 is the network address"),
    "interface with a blank": Mistake((PROD, '"interface": "eth0"', '"interface": "eth 0"'),
                                      says="gateway_vip.interface: String should match pattern"),
    "listen port on Prometheus's": Mistake((GATEWAY, '"listen_port": 80', '"listen_port": 9090'),
                                           says="gateway.listen_port: 9090 is Prometheus's port"),
    "listen port 0": Mistake((GATEWAY, '"listen_port": 80', '"listen_port": 0'),
                             says="gateway.listen_port: Input should be greater than or equal to 1"),
    "routing policy round robin": Mistake((GATEWAY, '"upstream_name": "vllm_backend",',
                                           '"upstream_name": "vllm_backend", "routing": {"policy": "round_robin"},'),
                                          says="gateway.routing.policy: Input should be"),
    "scrape interval without a unit": Mistake((ALL, 'service_user = "vllm"',
                                               'service_user = "vllm"\nmonitoring = {"scrape_interval": "15"}'),
                                              says="monitoring.scrape_interval: String should match pattern"),
    "a /33 firewall source": Mistake((ALL, 'service_user = "vllm"',
                                      'service_user = "vllm"\nmonitoring_allowed_sources = ["10.0.0.0/33"]'),
                                     says="monitoring_allowed_sources entry '10.0.0.0/33' is not an address or network"),
    "api port below 1024": Mistake((ALL, 'service_user = "vllm"', 'service_user = "vllm"\ninstance_ports = {"api": 80}'),
                                   says="instance_ports.api: 80 is below 1024"),
    "an instance named as the firewall's unit": Mistake(
        (PROD, "tensor_parallel_size = 2", 'tensor_parallel_size = 2\ninstances = [{"name": "firewall", "npus": [0, 1], '
         '"port": 8000, "hccl_base_port": 60000, "vllm_port": 51000}]'),
        says=f"instances: firewall's unit {FIREWALL_UNIT} is the fleet's own"),
    "colour Green": Mistake((ALL, 'service_user = "vllm"', 'service_user = "vllm"\ncolour = "Green"'),
                            says="colour: Input should be 'blue' or 'green'"),
    "a wave that is no group": Mistake((ALL, '["canary", "wave1", "wave2"]', '["canary", "wave1", "wave3"]'),
                                       says="wave3"),
    "pip index without a scheme": Mistake((ALL, 'service_user = "vllm"',
                                           'service_user = "vllm"\npip_index_url = "pypi.example.internal/simple"'),
                                          says="pip_index_url: expected an http:// or https:// URL"),
    "a relative model_dir": Mistake((INVENTORY, '"nvme_mount": "/mnt/nvme"', '"nvme_mount": "/mnt/nvme", '
                                     '"model_dir": "models"'), says="model_dir: expected an absolute path on the node"),
    "ssh_hostname with a trailing blank": Mistake((INVENTORY, 'gateway = [("gw-01.example.internal", _ssh)',
                                                   'gateway = [("gw-01.example.internal", {**_ssh, "ssh_hostname": '
                                                   '"10.0.0.2 "})'), says="ssh_hostname: '10.0.0.2 ' is not a DNS name"),
    # --- command lines (every host unreachable) ---
    "rollout --pause 1e309": Mistake(argv=("rollout", INVENTORY, "deploys/serve.py", "--pause", "1e309"),
                                     says="inf: expected a finite number"),
    "rollout --max-unavailable -1": Mistake(argv=("rollout", INVENTORY, "deploys/serve.py", "--max-unavailable", "-1"),
                                            says="Input should be greater than or equal to 1"),
    # An empty name between commas is dropped: the rollout goes on to the lease, where the unreachable gateway stops it.
    "rollout --waves with an empty group": Mistake(argv=("rollout", INVENTORY, "deploys/serve.py", "--waves",
                                                         "canary,,wave1"), outcome="connects"),
    "drain /vllm-0": Mistake(argv=("drain", INVENTORY, "/vllm-0"), says="expected HOST"),
    "drain an unknown host": Mistake(argv=("drain", INVENTORY, "npu-09.example.internal/vllm-0"),
                                     says="npu-09.example.internal"),
    "load --turns 0": Mistake(argv=("load", INVENTORY, "--turns", "0"), says="Input should be greater than or equal"),
    "load --duration inf": Mistake(argv=("load", INVENTORY, "--duration", "inf"),
                                   says="inf: expected a finite number above 0"),
    "plan --tp 0": Mistake(argv=("plan", INVENTORY, "--tp", "0"), says="Input should be greater than or equal to 1"),
    "plan --chip 910C": Mistake(argv=("plan", "--model-config", "tests/fixtures/models/qwen2.5-72b-instruct",
                                      "--chip", "910C"), says="910C"),
    "plan --dtype fp16": Mistake(argv=("plan", "--model-config", "tests/fixtures/models/qwen2.5-72b-instruct",
                                       "--dtype", "fp16"), says="fp16"),
    "bench --request-rate nan": Mistake(argv=("bench", INVENTORY, "--request-rate", "nan"),
                                        says="nan: expected a number above 0, or inf"),
    "tune --budget-minutes -1": Mistake(argv=("tune", INVENTORY, "--budget-minutes", "-1"),
                                        says="expected a finite number above 0"),
    "status --interval 0": Mistake(argv=("status", INVENTORY, "--interval", "0"), says="expected a finite number"),
    "lab up --subnet 10.0.0.1/8": Mistake(argv=("lab", "up", "--subnet", "10.0.0.1/8"), says="has host bits set"),
    "lab up --subnet of a public range": Mistake(argv=("lab", "up", "--subnet", "100.64.0.0/24"),
                                                 says="not a private range"),
    "lab up --name in capitals": Mistake(argv=("lab", "up", "--name", "LAB"), says="LAB"),
    "check of no file": Mistake(argv=("check", "inventories/nosuch.py"), says="no such inventory file"),
}


@pytest.fixture
def site(tmp_path, monkeypatch, resolving):  # noqa: F811
    (tmp_path / "inventories").mkdir()
    for name in ("prod.py", "prod.known_hosts"):
        shutil.copy(PROJECT_ROOT / "inventories" / name, tmp_path / "inventories" / name)
    for folder in ("group_data", "deploys", "tests/fixtures/models"):
        shutil.copytree(PROJECT_ROOT / folder, tmp_path / folder)
    models = tmp_path / "files/models/Eco-Tech/Qwen3.5-27B-w8a8-mtp/master"
    models.mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "tests/fixtures/models/qwen3.5-27b/config.json", models)
    monkeypatch.chdir(tmp_path)
    from ascend_fleet.lab import lab
    monkeypatch.setattr(lab, "up", lambda spec, console: pytest.fail("lab up went through to making a lab"))
    return tmp_path


def run(argv: tuple[str, ...]):
    """The command in this process: (exit code, its output and error line, the exception it ended with)."""
    result = CliRunner().invoke(build_app(argv[0]), list(argv))
    error = result.exception
    if error is not None and not isinstance(error, (FleetError, SystemExit)):
        raise error  # a traceback: the test fails with it
    code = getattr(error, "exit_code", 1) if isinstance(error, FleetError) else result.exit_code
    return code, result.output + (str(error) if isinstance(error, FleetError) else "")


@pytest.mark.parametrize("mistake", MISTAKES.values(), ids=MISTAKES.keys())
def test_each_hand_typed_mistake_is_refused_before_connecting_or_taken_as_meant(site, mistake):
    if mistake.edit:
        path, old, new = mistake.edit
        text = (site / path).read_text()
        assert old in text, f"{path} no longer holds {old!r}"
        (site / path).write_text(text.replace(old, new, 1))
    # The inventory by its absolute path: pyinfra keeps each file's code by the name it was given, and every test's
    # inventories/prod.py is another file.
    argv = tuple(str(site / INVENTORY) if word == INVENTORY else word for word in mistake.argv or ("check", INVENTORY))
    code, output = run(argv)
    # The example fleet's profile lists no vendor package's sha256 (a site adds its own): its one line otherwise.
    lines = [line for line in output.splitlines() if line.strip() and line != f"error: {UNFILLED_SHA256}"]
    if mistake.outcome == "taken":
        assert code in (0, 2) and not lines, output
        return
    if mistake.outcome == "connects":  # taken: what stops it is a host it cannot reach, after the check
        assert code == 1 and "Traceback" not in output, output
        return
    assert code == 2, output
    assert mistake.says in " ".join(output.replace("│", " ").split()), output
    if not mistake.argv:
        assert all(line.startswith("error: ") for line in lines), output  # one line each problem
