"""deploys/full.py on the lab: fresh OS to serving, idempotent, upgrades one node alone, refuses bad input.

The module runs first on the second lab (tests/lab/conftest.py), so it starts from fresh nodes
whatever other modules deployed on the session lab. The module's fixture deploys it and keeps
what the first deploy left (its output, the nodes' boot counts); each test starts from a converged
fleet and leaves it converged, so they run in any order.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from packaging.utils import canonicalize_name

from ascend_fleet import TEMPLATES
from ascend_fleet.config.profile import PipBuild, load_profile
from ascend_fleet.core.bundle_layout import MANIFEST
from ascend_fleet.core.node_layout import (
    CONFIG_DIR,
    FIREWALL_UNIT,
    GATEWAY_CONFIG,
    MANIFEST_NAME,
    PACKAGE_DIR,
    PIP_LOCK_DIR,
    SERVICE_ENV_FILE,
    instance_unit,
)
from ascend_fleet.core.templating import render
from ascend_fleet.facts.hccn import HCCN_CONF, HCCN_TOOL
from ascend_fleet.fleet.profile_lock import node_lock
from ascend_fleet.lab.inventory import lab_groups
from ascend_fleet.lab.mirror import locks_dir
from ascend_fleet.lab.publish import VENV_TOOLS
from ascend_fleet.lab.pyinfra_totals import totals
from ascend_fleet.operations.python_stack import satisfies
from tests.lab.conftest import BIN, INSTANCES, PROJECT, Lab

pytestmark = pytest.mark.lab

WORKERS = ("worker1", "worker2", "worker3")
FILLER = "/mnt/nvme/filler"
# Every port the lab data's instances take, blue and green (issue 13): API 8000-8001 and the green
# 8002-8003; VLLM_PORT 51000 + 16 per instance, four instances; HCCL 60000 + 32 per instance (the lab
# profile's CANN 8.5.1 takes 32: stack.hccl_port_span).
RESERVED = "8000-8003,51000-51063,60000-60127"
STAGES = ("Preflight", "Reserved instance ports", "NPU driver and firmware", "NPU network", "CANN", "Python stack", "Ascend environment",
          "Weights", "Serve", "Gateway", "Verify")
TIMINGS: dict[str, float] = {}


def planned_changes(dry_output: str) -> list[str]:
    """Operations a dry run detects changes for (certain or conditional) on some host."""
    rows = dry_output.split("--> Detected changes:")[1].split("\n\n")[0].splitlines()[2:]
    return [m[1] for m in (re.match(r"\s+(.+?)\s{2,}(\S.*)$", row) for row in rows)
            if m and re.search(r"\d+ \(", m[2])]


def changed_operations(output: str) -> list[str]:
    """Names of the operations pyinfra's results table counts as changed on some host."""
    rows = output.split("--> Results:")[1].splitlines()
    return [m[1].strip() for m in (re.match(r"\s+(.+?)\s{2,}\d+\s+(\d+)\s+", row) for row in rows) if m]


def chat(url: str) -> requests.Response:
    """A short chat completion of the lab's model through url (a gateway, or the gateways' address)."""
    return requests.post(f"{url}/v1/chat/completions", timeout=30, json={
        "model": "lab/Qwen3-Tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})


def chat_through_gateway(lab: Lab) -> requests.Response:
    return chat(f"http://{lab.address('gateway')}")


def unit_starts(lab: Lab, node: str) -> dict[str, str]:
    """When each instance's unit last entered the active state (changes only on a (re)start)."""
    units = " ".join(instance_unit(name) for name in INSTANCES)
    out = lab.run(node, f"for u in {units}; do "
                        "echo $u $(systemctl show -P ActiveEnterTimestampMonotonic $u); done").stdout
    return dict(line.split() for line in out.splitlines())


@pytest.fixture(scope="module")
def lab(second_lab):
    """Fresh nodes: 3 workers and a gateway nobody has deployed to (in place of the session lab).
    This module is the first on second_lab (tests/conftest.py); run after another, it brings the lab
    up anew."""
    if second_lab.run("worker1", f"test -e {CONFIG_DIR}", check=False).returncode == 0:
        second_lab.down()
    return second_lab.with_workers(len(WORKERS))


@pytest.fixture(scope="module")
def deployed(lab):
    """The fleet as a fresh lab deploys it: dry run first, then a run where two workers cannot
    serve (worker2 has an NPU in Alarm, worker3's NVMe is full), with a bounded load through the
    gateway after it; then, the hardware fixed, the run that brings them in, timed."""
    dry = lab.pyinfra("--dry", "deploys/full.py")
    healthy = rewrite_hardware(lab, "worker2", npu_health=["OK"] * 3 + ["Alarm"] + ["OK"] * 4)
    lab.run("worker3", f"fallocate -l $(( $(df --output=avail -B1 /mnt/nvme | tail -1) - 256 * 1024 * 1024 )) {FILLER}")
    started = time.monotonic()
    refused = lab.pyinfra("deploys/full.py", check=False, timeout=3600)
    TIMINGS["first"] = time.monotonic() - started
    load = lab.cli("load", lab.inventory, "--duration", "20", "--concurrency", "4", "--max-tokens", "8", "--json",
                   check=False)
    routed = lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout
    restore_hardware(lab, "worker2", healthy)
    lab.run("worker3", f"rm {FILLER}")
    result = lab.pyinfra("deploys/full.py", timeout=3600)
    boots = {n["name"]: n["boots"] for n in lab.status()["nodes"]}  # before any test reboots a node
    return {"dry": dry.stdout, "refused": refused, "refused_load": load, "refused_routes": routed,
            "first": result.stdout, "boots": boots}


def test_dry_run_on_a_fresh_fleet_lists_every_stages_work(deployed):
    changed = planned_changes(deployed["dry"])
    for stage in STAGES[1:-1]:  # preflight and verify only check
        assert any(name.startswith(f"{stage} | ") for name in changed), f"--dry shows no work for {stage}"


def test_workers_that_never_served_stay_out_of_the_gateway_and_no_request_fails(lab, deployed):
    """Issue 17: the gateway once listed the refused workers' instances; with 4 of 6 backends dead,
    nginx's retries ran out and clients got 502s."""
    refused = deployed["refused"]
    assert refused.returncode != 0
    assert re.search(r"worker2: unhealthy: NPU 3 Alarm", refused.stdout), refused.stdout[-3000:]
    assert re.search(r"worker3: lab/Qwen3-Tiny@v1 needs \d+ bytes on /mnt/nvme", refused.stdout), refused.stdout[-3000:]
    servers = re.findall(r"^\s*server (\S+) .*# (\S+)$", deployed["refused_routes"], re.M)
    assert sorted(name for _, name in servers) == ["worker1/vllm-0", "worker1/vllm-1"], deployed["refused_routes"]
    assert "proxy_next_upstream_tries 2;" in deployed["refused_routes"]
    load = deployed["refused_load"]
    assert load.returncode == 0, load.stdout + load.stderr
    summary = json.loads(load.stdout)
    assert summary["requests"] > 0 and summary["errors"] == 0, summary


def test_fresh_fleet_ends_serving_through_nginx_after_one_reboot_each(lab, deployed):
    assert totals(deployed["first"])["errors"] == 0
    for worker in WORKERS:  # no outgoing connection takes a port an instance listens on
        assert lab.run(worker, "sysctl -n net.ipv4.ip_local_reserved_ports").stdout.strip() == RESERVED
    reply = chat_through_gateway(lab)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    # Each worker booted at lab up and once more for its driver; the gateway never rebooted.
    assert deployed["boots"] == {"gateway": 1, "worker1": 2, "worker2": 2, "worker3": 2}


def test_second_run_changes_nothing(lab, deployed):
    # How each worker's boot-time units stand before the rerun: the firewall unit has been found
    # inactive after a driver reboot (issue 17), and the rerun would start it and hide how.
    units = {worker: lab.run(worker, "systemctl show -p ActiveState -p SubState -p Result -p ExecMainStatus "
                                     f"-p InactiveExitTimestamp -p ActiveEnterTimestamp {FIREWALL_UNIT}; "
                                     f"journalctl -b --no-pager -u {FIREWALL_UNIT} | tail -5", check=False).stdout
             for worker in WORKERS}
    started = time.monotonic()
    again = lab.pyinfra("deploys/full.py")
    TIMINGS["second"] = time.monotonic() - started
    counts = totals(again.stdout)
    assert counts["changed"] == 0 and counts["errors"] == 0, (changed_operations(again.stdout), units)
    # The times are reported, not asserted: on a shared 2-core machine they are noise.
    print(f"full deploy: first run {TIMINGS['first']:.0f}s, second run {TIMINGS['second']:.0f}s, "
          f"{counts['operations']} operations unchanged")
    assert planned_changes(lab.pyinfra("--dry", "deploys/full.py").stdout) == []


def planned_host_data(lab: Lab, node: str) -> dict:
    """The node's host data as the lab inventory gives it (its NPU network plan among it)."""
    return next(data for members in lab_groups(lab.lab_dir).values() for entry in members
                if isinstance(entry, tuple) for name, data in [entry] if name == node)


def test_each_npu_nic_has_its_planned_address_kept_in_hccn_conf(lab, deployed):
    """Issue 14: the NPU network stage gave each NPU's RoCE NIC its planned address with hccn_tool
    (and its checks, link to TLS, passed: the deploy ended without errors)."""
    for worker in WORKERS:
        planned = planned_host_data(lab, worker)
        out = lab.run(worker, f"for i in $(seq 0 7); do {HCCN_TOOL} -i $i -ip -g; done").stdout
        assert re.findall(r"^ipaddr:(\S+)$", out, re.M) == planned["npu_addresses"], out
        assert set(re.findall(r"^netmask:(\S+)$", out, re.M)) == {planned["npu_netmask"]}
        kept = lab.run(worker, f"cat {HCCN_CONF}").stdout
        assert all(f"address_{npu}={address}" in kept for npu, address in enumerate(planned["npu_addresses"])), kept


def test_an_npu_nic_down_stops_its_host_in_one_line_and_nothing_restarts(lab, deployed):
    """Issue 14: NPU 3's link on worker3 goes down (the switch side of its port); the rerun stops
    worker3 at the NPU network checks, naming host, NPU and check, and every instance keeps serving."""
    before = {worker: unit_starts(lab, worker) for worker in WORKERS}
    with lab.npu_link_down("worker3", 3):
        result = lab.pyinfra("deploys/full.py", check=False)
    assert result.returncode != 0
    assert ("worker3: NPU network: NPU 3: link DOWN (-link -g: link status: DOWN); check its optical module, "
            "cable and switch port") in result.stdout, result.stdout[-3000:]
    assert totals(result.stdout)["changed"] == 0
    assert {worker: unit_starts(lab, worker) for worker in WORKERS} == before
    assert chat_through_gateway(lab).status_code == 200


def test_the_service_environment_carries_cann_and_the_atb_build_of_the_serving_torch(lab, deployed):
    """npu.env is what CANN's and NNAL's set_env.sh set; ATB's build is the C++ ABI the venv's
    torch was built with, which the script asks the python3 on PATH for."""
    venv = load_profile("lab").pip.venv
    abi = lab.run("worker1", f"{venv}/bin/python3 -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))'")
    env = dict(line.split("=", 1) for line in lab.run("worker1", f"cat {SERVICE_ENV_FILE}").stdout.splitlines()
               if "=" in line and not line.startswith("#"))
    atb = f"/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_{abi.stdout.strip()}"
    assert env["ATB_HOME_PATH"] == atb
    libraries = env["LD_LIBRARY_PATH"].split(":")
    assert f"{atb}/lib" in libraries and f"{env['ASCEND_TOOLKIT_HOME']}/lib64" in libraries, libraries


# Values an env file must carry whole: a blank inside and around, quotes, a trailing backslash (a line
# continuation when bare), $ and ` (shell syntax), ; and # (comment starters at a line's start), %.
HOSTILE_ENV = {"A_BLANK": "a b", "A_LEADING_BLANK": " lead", "A_QUOTED": '"q" it\'s', "A_BACKSLASH": "x\\",
               "A_SHELL": "$HOME `id` %h", "A_COMMENT": "; # not a comment", "A_SINGLE": "'s'"}


def test_systemd_reads_the_env_files_values_back_as_written(lab, deployed):
    """npu.env as the environment stage renders it, read by the node's systemd (EnvironmentFile=) into a
    transient unit's environment: every value comes back exactly."""
    content = render(TEMPLATES / "npu.env.j2", captured={"CAPTURED_PATH": "/opt/x y/lib:/usr/lib"},
                     settings=HOSTILE_ENV)
    encoded = base64.b64encode(content.encode()).decode()
    shown = lab.run("worker1", f"echo {encoded} | base64 -d > /run/hostile.env && systemd-run --quiet --wait --pipe "
                               "-p EnvironmentFile=/run/hostile.env /usr/bin/env -0; rm -f /run/hostile.env").stdout
    environment = dict(entry.split("=", 1) for entry in shown.split("\0") if "=" in entry)
    assert {name: environment.get(name) for name in [*HOSTILE_ENV, "CAPTURED_PATH"]} == {
        **HOSTILE_ENV, "CAPTURED_PATH": "/opt/x y/lib:/usr/lib"}, content


def test_every_boot_of_the_whole_fleet_loads_each_workers_firewall_and_fails_no_unit(lab, deployed):
    """The workers rebooted together, five times, as a power cut or a fleet-wide driver reboot does:
    units of the same name start on every node at once (issue 17: the firewall was once found
    inactive on one worker after the driver reboot, 219/CGROUP)."""
    for boot in range(1, 6):
        before = {worker: lab.boot_id(worker) for worker in WORKERS}
        lab.pyinfra("server.reboot", "--limit", "workers")
        for worker in WORKERS:
            assert lab.boot_id(worker) != before[worker], f"boot {boot}: {worker} did not reboot"
            state = lab.run(worker, "systemctl is-system-running --wait; systemctl --failed --no-legend --plain; "
                                    "nft list table inet ascend_fleet > /dev/null && echo table loaded; "
                                    "sysctl -n net.ipv4.ip_local_reserved_ports", check=False)
            assert state.stdout.split() == ["running", "table", "loaded", RESERVED], f"boot {boot}, {worker}: {state.stdout}"
    reply = chat_through_gateway(lab)
    assert reply.status_code == 200, reply.text


def test_the_stack_is_its_upstream_row_installed_in_steps_where_one_pip_run_is_refused(lab, deployed):
    """The stand-ins carry the real wheels' pins, so the lab meets what a real node meets: one pip
    run of every pin is a conflict on torch (PyPI's vllm pins its own), the guide's steps succeed,
    and vllm's pin is left broken as upstream accepts. Then, in the Dockerfile's order, the CUDA
    triton that x86_64's first step brought (xgrammar's) is gone, and upstream's builds sit over the wheel's pins."""
    profile = load_profile("lab")
    venv = profile.pip.venv
    listing = json.loads(lab.run("worker1", f"{venv}/bin/python -m pip list --format json").stdout)
    installed = {row["name"].lower().replace("_", "-"): row["version"] for row in listing}
    builds = {step.name: step.version for step in profile.node_steps("x86_64") if isinstance(step, PipBuild)}
    assert builds == {"triton-ascend": "3.2.0.dev20260322", "torch-npu": "2.9.0.post1+gitdc51c2d"}
    for name, version in profile.pip_pins().items():
        assert satisfies(installed, f"{name}=={version}") or installed[name] == builds[name], installed.get(name)
    assert installed["triton-ascend"] == builds["triton-ascend"] and "triton" not in installed
    imported = lab.run("worker1", f"{venv}/bin/python -c 'import triton; print(triton.__version__)'").stdout
    assert imported.strip() == builds["triton-ascend"]  # its files, not CUDA triton's, in site-packages/triton/
    every_pin = " ".join(f"{name}=={version}" for name, version in profile.pip_pins().items())
    mirror = lab.mirror_url
    one_run = lab.run("worker1", f"{venv}/bin/python -m pip install --dry-run --ignore-installed --index-url "
                                 f"{mirror}/simple --trusted-host {urlsplit(mirror).hostname} {every_pin}", check=False)
    assert one_run.returncode != 0 and "ResolutionImpossible" in one_run.stderr
    # pip names the last pair it backtracked over; the deploy's step 3, the same pins less vllm, resolved.
    conflict = one_run.stdout.split("The conflict is caused by:")[1].split("To fix this")[0]
    assert re.search(r"depends on torch==", conflict), conflict
    check = lab.run("worker1", f"{venv}/bin/python -m pip check", check=False).stdout.splitlines()
    # vllm 0.18.0's wheel pins torch 2.10.0; vllm-ascend's step put its own 2.9.0 in its place.
    assert f"vllm {profile.stack.vllm} has requirement torch==2.10.0, but you have torch 2.9.0+cpu." in check, check
    assert "vllm-ascend 0.18.0 has requirement torch-npu==2.9.0, but you have torch-npu 2.9.0.post1+gitdc51c2d." \
        in check, check
    assert profile.unaccepted_complaints(check) == []


# Each distribution's version and the sha256 of its RECORD (every installed file's own sha256): two nodes
# with the same line installed the same files.
INSTALLED_FILES = ("import hashlib, importlib.metadata as m; [print(d.metadata['Name'], d.version, "
                   "hashlib.sha256(d.read_text('RECORD').encode()).hexdigest()) for d in m.distributions()]")


def assert_the_workers_hold_exactly_the_lock(lab, workers: list[str], locks: Path) -> None:
    """Every worker holds the same distributions with the same RECORDs, and they are profile lab's lock in
    locks (the builds over pins and the venv's own tools besides)."""
    profile = load_profile("lab")
    lock = node_lock(profile, "x86_64", profile.stack.python, locks)
    assert lock is not None, f"no lock of profile lab in {locks}"
    venv = profile.pip.venv
    held = {}
    for worker in workers:
        lines = lab.run(worker, f"cd / && {venv}/bin/python -c {shlex.quote(INSTALLED_FILES)}").stdout.split("\n")
        held[worker] = {canonicalize_name(name): (version, digest)
                        for name, version, digest in (line.split() for line in lines if line)}
    assert all(held[worker] == held[workers[0]] for worker in workers)
    versions = {name: version for name, (version, _) in held[workers[0]].items()}
    builds = {step.name: step.version for step in profile.node_steps("x86_64") if isinstance(step, PipBuild)}
    assert versions == {**lock.pins, **builds, **{tool: versions[tool] for tool in VENV_TOOLS if tool in versions}}
    assert lab.run(workers[0], f"cat {PIP_LOCK_DIR}/{lock.name}").stdout == lock.text


def test_every_worker_holds_the_same_python_files_and_they_are_the_labs_lock(lab, deployed):
    """The lab locked its profile against its mirror at lab up; each worker installed exactly that lock."""
    assert_the_workers_hold_exactly_the_lock(lab, list(WORKERS), locks_dir(lab.lab_dir))


@pytest.fixture(scope="module")
def lab_bundle(lab, deployed, tmp_path_factory) -> Path:
    """`ascend-fleet bundle` of the lab's own fleet, made from its mirror (Debian's archive through its proxy)."""
    out = tmp_path_factory.mktemp("lab-bundle") / "bundle"
    made = subprocess.run([str(BIN / "ascend-fleet"), "bundle", lab.inventory, "--out", str(out), "--arch", "x86_64",
                           "--os", f"Debian 12={lab.mirror_url}/debian"],
                          env=lab.env, cwd=PROJECT, capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stdout + made.stderr
    return out


def test_a_bundle_with_one_byte_changed_or_without_the_nodes_arch_stops_the_deploy_before_any_change(
        lab, lab_bundle, tmp_path):
    """The site's bundle is checked at preflight: one byte changed in a wheel, or a bundle for another arch,
    stops the run while pyinfra prepares it."""
    out = tmp_path / "bundle"
    shutil.copytree(lab_bundle, out)
    fleet = [str(BIN / "ascend-fleet"), "bundle"]
    wheel = next(p for p in (out / "packages").iterdir() if p.name.startswith("vllm_ascend-0.18.0-"))
    original = wheel.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 1
    wheel.write_bytes(bytes(data))
    verify = subprocess.run([*fleet, "verify", str(out)], capture_output=True, text=True)
    assert verify.returncode == 1 and f"packages/{wheel.name} differs from the manifest" in verify.stdout
    refused = lab.pyinfra("deploys/full.py", "--data", f"bundle_dir={out}", check=False)
    assert refused.returncode != 0
    bundle = re.escape(str(out))
    # The data alone tells (`ascend-fleet check`, which every deploy runs first): nothing is connected to.
    assert re.search(rf"pyinfra error: gateway, worker1, .*: bundle {bundle}: packages/{re.escape(wheel.name)} "
                     "differs from the manifest", refused.stdout), refused.stdout[-3000:]
    assert "Connecting to hosts" not in refused.stdout
    wheel.write_bytes(original)
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "platforms": [
        {**platform, "arch": "aarch64"} for platform in manifest["platforms"]]}))
    other_arch = lab.pyinfra("deploys/full.py", "--data", f"bundle_dir={out}", check=False)
    assert other_arch.returncode != 0 and "Beginning operation run" not in other_arch.stdout
    assert re.search(rf"worker\d: bundle {bundle} has no lab for x86_64 Python 3.11 \(it has lab aarch64 Python "
                     r"3.11\); make it with `ascend-fleet bundle INVENTORY", other_arch.stdout), \
        other_arch.stdout[-3000:]


def test_raising_one_nodes_driver_upgrades_it_alone(lab, deployed):
    before = {node: unit_starts(lab, node) for node in WORKERS}
    boots = {n["name"]: n["boots"] for n in lab.status()["nodes"]}
    # A run that may restart only vllm-0 (a rollout at --max-unavailable 1) cannot take the reboot,
    # which would stop vllm-1 while the gateway routes to it: refused, nothing changed.
    refused = lab.pyinfra("deploys/full.py", "--limit", "worker2", "--data", "profile=lab-previous",
                          "--data", 'serve_only=["vllm-0"]', check=False)
    assert refused.returncode != 0
    assert "worker2: driver 24.1.0 / firmware 7.5.0.3.220 need a reboot, which stops vllm-1 too, but this run may " \
           "restart only vllm-0; roll it out with --max-unavailable 2 or more" in refused.stdout, refused.stdout[-3000:]
    # Stopped at the driver stage's gate, before any operation changed anything, with none after it.
    before_gate, after_gate = refused.stdout.split("Starting operation: NPU driver and firmware | No reboot while")
    assert before_gate.count("Starting operation: ") == before_gate.count("] No changes"), before_gate
    assert "Starting operation" not in after_gate
    assert unit_starts(lab, "worker2") == before["worker2"]
    # worker2 goes back to the previous stack, then up to the current one again: firmware before
    # driver each time (the node has a driver), one reboot each, its instances restarted.
    down = lab.pyinfra("deploys/full.py", "--limit", "worker2", "--data", "profile=lab-previous")
    up = lab.pyinfra("deploys/full.py", "--limit", "worker2")
    for output, (firmware, driver) in ((down.stdout, ("7.5.0.3.220", "24.1.0")), (up.stdout, ("7.7.0.6.236", "25.2.0"))):
        changed = changed_operations(output)
        assert changed.index(f"NPU driver and firmware | NPU firmware {firmware}") < \
            changed.index(f"NPU driver and firmware | NPU driver {driver}")
        assert "NPU driver and firmware | Reboot to load the new driver and firmware" in changed
    after = {n["name"]: n["boots"] for n in lab.status()["nodes"]}
    assert after == {**boots, "worker2": boots["worker2"] + 2}
    assert unit_starts(lab, "worker1") == before["worker1"] and unit_starts(lab, "worker3") == before["worker3"]
    assert all(before["worker2"][u] != t for u, t in unit_starts(lab, "worker2").items())
    assert chat_through_gateway(lab).status_code == 200


def one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if "pyinfra error" in line or re.match(r"\s+\[\w+\] \w+: ", line)]
    assert errors, output[-3000:]
    return errors[0]


def test_unknown_profile_stops_before_any_host_is_touched(lab, deployed):
    result = lab.pyinfra("deploys/full.py", "--data", "profile=nosuch", check=False)
    assert result.returncode != 0
    line = one_error_line(result.stdout)
    assert "unknown profile 'nosuch'" in line or "profile 'nosuch'" in line
    assert "Starting operation" not in result.stdout


def test_a_plan_that_does_not_fit_stops_before_any_host_is_touched(lab, deployed):
    # The tiny model knows 4096 positions: no instance can serve a 1M-token context.
    serving = json.dumps({"max_model_len": 1_000_000, "gpu_memory_utilization": 0.9, "dtype": "float16"})
    result = lab.pyinfra("deploys/full.py", "--data", f"serving={serving}", check=False)
    assert result.returncode != 0
    # Checked before pyinfra connects (inventories/lab.py's last line): each instance named, on one line.
    assert re.search(r"worker1 instance vllm-0, worker1 instance vllm-1, worker2 instance vllm-0 and 3 more: ",
                     result.stdout), result.stdout[-2000:]
    assert "Connecting to hosts" not in result.stdout and result.returncode == 2


def test_an_nvme_too_small_for_the_weights_stops_before_anything_changes(lab, deployed):
    # A revision like v1 whose manifest claims a 20 GiB shard: more than the lab's 8 GB NVMe holds.
    models = lab.lab_dir / "mirror" / "models" / "lab" / "Qwen3-Tiny"
    huge = models / "huge"
    shutil.copytree(models / "v1", huge)
    try:
        manifest = json.loads((huge / MANIFEST_NAME).read_text())
        manifest["revision"] = "huge"
        next(iter(manifest["files"].values()))["size"] = 20 * 1024**3
        (huge / MANIFEST_NAME).write_text(json.dumps(manifest))
        model = json.dumps({"id": "lab/Qwen3-Tiny", "revision": "huge", "source": "http"})
        before = unit_starts(lab, "worker2")
        result = lab.pyinfra("deploys/full.py", "--limit", "worker2", "--data", f"model={model}", check=False)
    finally:
        shutil.rmtree(huge)
    assert result.returncode != 0
    assert re.search(r"worker2: lab/Qwen3-Tiny@huge needs \d+ bytes on /mnt/nvme .* but \d+ are free", result.stdout)
    assert "Stage: driver and firmware" not in result.stdout
    assert unit_starts(lab, "worker2") == before


def test_two_instances_on_one_npu_are_refused_before_any_host_is_touched(lab, deployed):
    instances = json.dumps([
        {"name": "vllm-0", "npus": [0, 1, 2, 3], "port": 8000, "hccl_base_port": 60000, "vllm_port": 51000},
        {"name": "vllm-1", "npus": [3, 4, 5, 6], "port": 8001, "hccl_base_port": 60032, "vllm_port": 51016},
    ])
    result = lab.pyinfra("deploys/full.py", "--limit", "worker1", "--data", f"instances={instances}", check=False)
    assert result.returncode != 0
    # --data is every host's: each worker is refused, before pyinfra connects.
    assert re.search(r"pyinfra error: worker1, worker2, worker3: instances: .*NPU 3", result.stdout), \
        result.stdout[-2000:]
    assert "Connecting to hosts" not in result.stdout and result.returncode == 2


def test_ascend_quantization_of_weights_without_msmodelslims_description_restarts_nothing(lab, deployed):
    # The plan reads only the model's config, so a stated scheme passes it; the node's files decide.
    serving = json.dumps({"max_model_len": 2048, "gpu_memory_utilization": 0.9, "dtype": "float16",
                          "quantization": "ascend", "quantization_scheme": "w8a8"})
    before = unit_starts(lab, "worker1")
    result = lab.pyinfra("deploys/serve.py", "--limit", "worker1", "--data", f"serving={serving}", check=False)
    assert result.returncode != 0
    assert re.search(r"worker1: .*serving.quantization ascend, but \S+/lab/Qwen3-Tiny/\S+/"
                     r"quant_model_description.json is missing: these weights are not msModelSlim's", result.stdout), \
        result.stdout[-3000:]
    assert unit_starts(lab, "worker1") == before


def rewrite_hardware(lab: Lab, node: str, **changes) -> str:
    """Change a running node's simulated hardware in place (the node sees it at once); returns the original."""
    hardware_file = lab.lab_dir / "nodes" / node / "ascend-lab" / "hardware.json"
    original = hardware_file.read_text()
    hardware_file.write_text(json.dumps({**json.loads(original), **changes}))
    return original


def restore_hardware(lab: Lab, node: str, original: str) -> None:
    (lab.lab_dir / "nodes" / node / "ascend-lab" / "hardware.json").write_text(original)


def test_npu_count_off_the_inventory_stops_that_host_only(lab, deployed):
    before = unit_starts(lab, "worker1")
    original = rewrite_hardware(lab, "worker1", npu_count=4, npu_health=["OK"] * 4)
    try:
        result = lab.pyinfra("deploys/full.py", "--limit", "worker1", check=False)
    finally:
        restore_hardware(lab, "worker1", original)
    assert result.returncode != 0
    assert "worker1: npu-smi lists 4 NPUs but the inventory says npu_count=8" in result.stdout
    # The host stopped at preflight: no later stage started on it.
    assert "Stage: driver and firmware" not in result.stdout
    assert unit_starts(lab, "worker1") == before


def test_an_unhealthy_npu_stops_that_host_and_leaves_its_instances_serving(lab, deployed):
    before = unit_starts(lab, "worker3")
    original = rewrite_hardware(lab, "worker3", npu_health=["OK"] * 5 + ["Critical"] + ["OK"] * 2)
    try:
        result = lab.pyinfra("deploys/full.py", check=False)
    finally:
        restore_hardware(lab, "worker3", original)
    assert "worker3: unhealthy: NPU 5 Critical" in result.stdout
    assert totals(result.stdout)["changed"] == 0
    assert unit_starts(lab, "worker3") == before
    assert chat_through_gateway(lab).status_code == 200


def test_a_node_whose_glibc_no_pinned_wheel_covers_is_refused_at_preflight_and_the_others_run(lab, deployed):
    """Issue 12: worker2 reports glibc 2.28 (its hardware file; the lab's userland is bookworm's), older
    than the manylinux_2_31 of the pinned vllm 0.18.0's wheels: refused before anything of it changes,
    where it would otherwise have stopped at its pip step after driver, firmware, reboot and CANN."""
    before = unit_starts(lab, "worker2")
    original = rewrite_hardware(lab, "worker2", glibc="2.28")
    try:
        result = lab.pyinfra("deploys/full.py", check=False)
    finally:
        restore_hardware(lab, "worker2", original)
    assert result.returncode != 0
    assert re.search(r"worker2: vllm==0\.18\.0 has no wheel for x86_64 Python 3\.11 glibc 2\.28: its wheels are for "
                     r"manylinux_2_31_x86_64 \(cp38-abi3\)", result.stdout), result.stdout[-3000:]
    assert totals(result.stdout)["changed"] == 0
    assert unit_starts(lab, "worker2") == before
    # The others went on to the end; worker2 stopped at preflight: no operation of a later stage ran on it.
    verified = result.stdout.split("Starting operation: Verify | NPUs healthy")[1].split("Starting operation")[0]
    assert "[worker1]" in verified and "[worker3]" in verified and "[worker2]" not in verified
    after_preflight = result.stdout.split("Starting operation: NPU driver and firmware", 1)[1]
    assert not re.search(r"\[worker2\] (Success|No changes)", after_preflight), after_preflight[:3000]


def test_a_package_with_a_wrong_sha256_is_never_installed(lab, deployed):
    files = lab.lab_dir / "mirror" / "files"
    corrupt = files / "corrupt"  # served at <mirror>/files/corrupt/
    corrupt.mkdir(exist_ok=True)
    for package in files.glob("*24.1.0*"):  # the previous stack's driver, not on the nodes now
        (corrupt / package.name).write_bytes(package.read_bytes()[:-64] + b"\0" * 64)
        for worker in lab.workers:  # nor on a peer (worker2 went back to it above), so the origin is asked
            lab.run(worker, f"rm -f {PACKAGE_DIR}/{package.name}")
    mirror = lab.status()["mirror"]["url"]
    before = unit_starts(lab, "worker1")
    try:
        result = lab.pyinfra("deploys/full.py", "--limit", "worker1", "--data", "profile=lab-previous",
                             "--data", f"vendor_mirror_url={mirror}/files/corrupt", check=False)
    finally:
        shutil.rmtree(corrupt)
    assert result.returncode != 0
    assert re.search(r"Ascend-hdk-910b-npu-driver_24\.1\.0_linux-\w+\.run from .* has sha256 \w+, "
                     r"the profile expects \w+", result.stdout)
    assert "24.1.0" not in lab.run("worker1", "cat /usr/local/Ascend/driver/version.info").stdout
    assert unit_starts(lab, "worker1") == before
