"""Secrets and exposure on the lab: hub tokens and the vLLM API key planted in the control
machine's environment reach the nodes only as root-only 0600 env files; nothing else on any
node (files, journal, process list, Nginx logs) and nothing the tools print holds them. With the
key set, the instances and the gateway refuse /v1 without it; the public listener never serves
/metrics or /health, and each worker's firewall lets only the gateway (nginx, Prometheus) reach
the instance ports and only workers the weights peer port. The module ends with a deploy without the key, so later modules find the
lab serving openly as before."""

from __future__ import annotations

import copy
import http.client
import json
import secrets
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from ascend_fleet.control.loadgen import LoadGenerator
from ascend_fleet.core.node_layout import (
    CONFIG_DIR,
    FIREWALL_RULES_FILE,
    FIREWALL_UNIT,
    GATEWAY_API_KEY_FILE,
    HUB_TOKENS_FILE,
    INSTANCE_ENV_DIR,
    instance_env_file,
    instance_unit,
    unit_file,
)
from tests.lab.conftest import ALL_AT_ONCE, BIN, INSTANCES, PROJECT, Lab
from tests.lab.test_full_deploy import totals

pytestmark = pytest.mark.lab

WORKER_PRIVATE_FILES = {HUB_TOKENS_FILE, *(instance_env_file(name) for name in INSTANCES)}
GATEWAY_PRIVATE_FILES = {GATEWAY_API_KEY_FILE}
INSTANCE_PORTS = (8000, 8001)
PEER_PORT = 8090  # the weights peer port (model.peer_port's default)
# Every file of the node (also /run, /tmp and the NVMe), its journal, its process list (arguments
# of every process) and what /proc says each process was started with; not /proc's environ files,
# where a process's environment is, by design, the key vLLM reads. The planted values come on
# stdin (grep -f), so no command line on the node ever holds them.
SCAN = r"""
scan=$(mktemp -d /dev/shm/scan.XXXXXX)
journalctl --no-pager -o cat > "$scan/journal" 2>&1
ps -eww -o user,pid,args > "$scan/ps"
for cmdline in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$cmdline"; echo; done > "$scan/cmdlines" 2>/dev/null
grep -raoF -f /dev/stdin --devices=skip --exclude-dir=proc --exclude-dir=sys / "$scan" 2>/dev/null | sort -u
rm -rf "$scan"
"""



@pytest.fixture(scope="module")
def planted(lab: Lab):
    """Unique tokens and key in the control environment, a full deploy with them (verbose, with
    --diff), then the tools that talk to the fleet; afterwards the fleet is deployed without them."""
    values = {"HF_TOKEN": f"hf_{secrets.token_hex(16)}", "MODELSCOPE_API_TOKEN": f"ms-{secrets.token_hex(16)}",
              "VLLM_API_KEY": f"key-{secrets.token_hex(16)}"}
    keyed = copy.copy(lab)
    keyed.env = {**lab.env, **values}
    deployed = keyed.pyinfra("-vv", "--diff", "deploys/full.py", *ALL_AT_ONCE, timeout=3600)
    outputs = {"pyinfra full.py -vv --diff": deployed.stdout}
    for name, args in {"status --json": ("status", "inventories/lab.py", "--json"),
                       "load --json": ("load", "inventories/lab.py", "--requests", "8", "--concurrency", "2", "--json"),
                       "rollout canary --json": ("rollout", "inventories/lab.py", "deploys/serve.py", "--waves",
                                                 "canary", "--json")}.items():
        result = keyed.cli(*args, check=False, timeout=1800)
        # Apart: stderr may carry progress lines (a status read over 5 s says which hosts it awaits).
        outputs[name], outputs[f"{name} (stderr)"] = result.stdout, result.stderr
    yield keyed, values, outputs
    lab.pyinfra("deploys/full.py", *ALL_AT_ONCE, timeout=3600)
    gateway = f"http://{lab.address('gateway')}"
    assert requests.get(f"{gateway}/v1/models", timeout=10).status_code == 200, "the lab still requires the key"


def answer_from(lab: Lab, node: str, url: str) -> str:
    """The HTTP status a node gets for a URL, or "refused" when the connection is refused."""
    result = lab.run(node, f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {url}", check=False)
    return "refused" if result.returncode == 7 else result.stdout.strip()


def connect_from_here(address: str, port: int) -> str:
    """Whether this machine (the lab host, where the tools run) can open a TCP connection."""
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "dropped"
    return "open"


def loaded_rules(lab: Lab, node: str) -> str:
    """The comment of the node's loaded firewall table (the digest of its rules), "" if none is loaded."""
    return lab.run(node, "nft list table inet ascend_fleet 2>/dev/null | sed -n 2p; true").stdout.strip()


def raw_get(host: str, port: int, path: str, headers: dict[str, str]) -> int:
    """Status of a GET sent with the path exactly as written (requests would resolve its dot segments)."""
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request("GET", path, headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


def scan_node(lab: Lab, node: str, values: dict[str, str]) -> dict[str, set[str]]:
    """{planted name: files of the node holding its value}."""
    result = subprocess.run([str(BIN / "ascend-fleet"), "lab", "ssh", node, "--", SCAN], env=lab.env, cwd=PROJECT,
                            input="\n".join(values.values()) + "\n", capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    found: dict[str, set[str]] = {name: set() for name in values}
    for line in result.stdout.splitlines():
        path, _, value = line.rpartition(":")
        name = next(name for name, planted_value in values.items() if planted_value == value)
        found[name].add(path if not path.startswith("/dev/shm/scan.") else path.rsplit("/", 1)[1])
    return found


def test_the_tools_work_with_the_key_and_print_no_secret(planted):
    lab, values, outputs = planted
    status = json.loads(outputs["status --json"])
    assert status["ok"], outputs["status --json"][-3000:]
    load = json.loads(outputs["load --json"])
    assert load["requests"] == 8 and load["errors"] == 0, load
    assert json.loads(outputs["rollout canary --json"])["ok"], outputs["rollout canary --json (stderr)"][-3000:]
    logs = {str(path): path.read_text(errors="replace")
            for path in (lab.lab_dir / "fleet").rglob("*") if path.is_file()}
    assert any(path.parent.name == "logs" for path in map(Path, logs)), f"the rollout kept no pyinfra log: {sorted(logs)}"
    for name, text in {**outputs, **logs}.items():
        leaked = [key for key, value in values.items() if value in text]
        assert not leaked, f"{name} shows {leaked}"


def test_the_planted_values_are_only_in_root_only_env_files(planted):
    lab, values, _ = planted
    nodes = lab.nodes
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        scans = dict(zip(nodes, pool.map(lambda node: scan_node(lab, node, values), nodes)))
    for node, found in scans.items():
        if node == "gateway":
            assert found == {"HF_TOKEN": set(), "MODELSCOPE_API_TOKEN": set(), "VLLM_API_KEY": GATEWAY_PRIVATE_FILES}
            private = GATEWAY_PRIVATE_FILES
        else:
            hub_tokens = {HUB_TOKENS_FILE}
            assert found == {"HF_TOKEN": hub_tokens, "MODELSCOPE_API_TOKEN": hub_tokens,
                             "VLLM_API_KEY": WORKER_PRIVATE_FILES - hub_tokens}, (node, found)
            private = WORKER_PRIVATE_FILES
        modes = lab.run(node, f"stat -c '%n %a %U %G' {' '.join(sorted(private))}").stdout.split("\n")
        assert sorted(line.split(" ", 1)[1] for line in modes if line) == ["600 root root"] * len(private), modes


def test_units_run_as_the_service_user_root_owned_and_not_world_writable(planted):
    lab, _, _ = planted
    worker = lab.workers[0]
    unit_files = " ".join(unit_file(instance_unit(name)) for name in INSTANCES)
    files = lab.run(worker, f"stat -c '%n %a %U %G' {unit_files} {CONFIG_DIR} {INSTANCE_ENV_DIR}").stdout.splitlines()
    for line in files:
        name, mode, user, group = line.split()
        assert (user, group) == ("root", "root") and int(mode[-1]) & 2 == 0 and int(mode[-2]) & 2 == 0, line
    for unit in map(instance_unit, INSTANCES):
        pid = lab.run(worker, f"systemctl show -P MainPID {unit}").stdout.strip()
        owner = lab.run(worker, f"ps -o user= -p {pid}").stdout.strip()
        devices = lab.run(worker, f"ls -l /proc/{pid}/fd | grep -o '/dev/davinci[0-9]*' | sort -u").stdout.split()
        assert owner == "vllm" and len(devices) == 4, (unit, owner, devices)


def test_v1_needs_the_key_and_the_public_listener_hides_health_and_metrics(planted):
    lab, values, _ = planted
    gateway = f"http://{lab.address('gateway')}"
    body = {"model": "lab/Qwen3-Tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    key = {"Authorization": f"Bearer {values['VLLM_API_KEY']}"}
    assert requests.post(f"{gateway}/v1/chat/completions", json=body, timeout=30).status_code == 401
    assert requests.post(f"{gateway}/v1/chat/completions", json=body, timeout=30,
                         headers={"Authorization": "Bearer not-the-key"}).status_code == 401
    answer = requests.post(f"{gateway}/v1/chat/completions", json=body, headers=key, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"], answer.text
    for path in ("/metrics", "/health", "/v1/../metrics", "/v1/%2e%2e/health"):  # not even for a keyed client
        assert raw_get(lab.address("gateway"), 80, path, key) == 404, path
    # nginx routes it as /v1/models but forwards it as written: no route and no way around the key.
    assert raw_get(lab.address("gateway"), 80, "/metrics/../v1/models", {}) in (401, 404)
    worker = f"http://{lab.address(lab.workers[0])}"
    for port in INSTANCE_PORTS:  # the gateway and Prometheus reach the instances' own ports
        assert answer_from(lab, "gateway", f"{worker}:{port}/v1/models") == "401"
        assert answer_from(lab, "gateway", f"{worker}:{port}/metrics") == "200"
        assert answer_from(lab, "gateway", f"{worker}:{port}/health") == "200"


def test_instance_ports_answer_the_gateway_and_loopback_only_and_the_peer_port_workers_only(planted):
    lab, _, _ = planted
    worker, other_worker = lab.address("worker1"), "worker2"
    for port in INSTANCE_PORTS:
        assert answer_from(lab, "gateway", f"http://{worker}:{port}/health") == "200"
        assert answer_from(lab, "worker1", f"http://127.0.0.1:{port}/health") == "200"
        assert answer_from(lab, other_worker, f"http://{worker}:{port}/health") == "refused"
        assert connect_from_here(worker, port) == "refused"
    assert answer_from(lab, other_worker, f"http://{worker}:{PEER_PORT}/published/") == "200"
    assert answer_from(lab, "gateway", f"http://{worker}:{PEER_PORT}/published/") == "refused"
    assert connect_from_here(worker, PEER_PORT) == "refused"
    # Nothing else is touched: SSH (every lab.run) and node_exporter answer this machine as before.
    assert connect_from_here(worker, 22) == connect_from_here(worker, 9100) == "open"


def test_the_firewall_comes_off_and_on_under_load_a_rerun_changes_nothing_and_a_reboot_keeps_it(planted, monkeypatch):
    lab, values, _ = planted
    monkeypatch.setenv("VLLM_API_KEY", values["VLLM_API_KEY"])  # the load generator's key
    worker = lab.address("worker3")
    rules = loaded_rules(lab, "worker3")
    assert rules.startswith('comment "ascend-fleet rules sha256:'), rules
    generator = LoadGenerator(f"http://{lab.address('gateway')}", "lab/Qwen3-Tiny", concurrency=2).start()
    try:
        lab.pyinfra("--data", "instance_firewall=false", "deploys/firewall.py")
        assert loaded_rules(lab, "worker3") == "" and connect_from_here(worker, INSTANCE_PORTS[0]) == "open"
        assert lab.run("worker3", f"test ! -e {FIREWALL_RULES_FILE}", check=False).returncode == 0
        lab.pyinfra("deploys/firewall.py")
    finally:
        load = generator.stop().summary()
    assert load["requests"] > 10 and load["errors"] == 0, load
    assert loaded_rules(lab, "worker3") == rules and connect_from_here(worker, INSTANCE_PORTS[0]) == "refused"
    again = lab.pyinfra("deploys/firewall.py").stdout
    assert totals(again)["changed"] == 0, again[-3000:]
    assert lab.run("worker3", f"systemctl is-enabled {FIREWALL_UNIT}").stdout.strip() == "enabled"
    lab.reboot("worker3")
    assert loaded_rules(lab, "worker3") == rules
    assert connect_from_here(worker, INSTANCE_PORTS[0]) == "refused"
