"""Faults injected for real on the lab: each run ends with one clear line naming the host and what
to do, leaves nothing half-installed in use, stops nothing that was serving, and a plain rerun
converges. docs/faults.md lists every fault with the test that covers it (some live in
test_full_deploy.py and test_weights.py).

The module starts from a serving fleet (a full deploy; a rerun if another module deployed the
session lab) and leaves it serving: no node held down, no link slowed, no NPU held.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import (
    DEEP_VERIFY_NAME,
    GATEWAY_CONFIG,
    MARKER_NAME,
    NGINX_CONF_DIR,
    PACKAGE_DIR,
    WEIGHTS_STAGER,
    instance_unit,
)
from tests.lab.conftest import BIN, INSTANCES, PROJECT, Lab
from tests.lab.test_full_deploy import chat_through_gateway, restore_hardware, rewrite_hardware, totals, unit_starts

pytestmark = pytest.mark.lab

# profiles/lab-previous.yaml
PREVIOUS_FIRMWARE = "Ascend-hdk-910b-npu-firmware_7.5.0.3.220.run"
PREVIOUS_DRIVER = "Ascend-hdk-910b-npu-driver_24.1.0_linux-$(uname -m).run"
PREVIOUS_TOOLKIT = "Ascend-cann-toolkit_8.3.RC2"
UNITS = tuple(instance_unit(name) for name in INSTANCES)
# An operator's file beside the gateway's config, not the deploy's.
LEFTOVER_CONFIG = f"{NGINX_CONF_DIR}/zz-leftover.conf"
V2 = json.dumps({"id": "lab/Qwen3-Tiny", "revision": "v2", "source": "http"})
V2_DIR = "/mnt/nvme/models/lab/Qwen3-Tiny/v2"
V2_PARTIAL = "/mnt/nvme/models/.partial/lab/Qwen3-Tiny/v2"
V1_DIR = "/mnt/nvme/models/lab/Qwen3-Tiny/v1"
# What the staging watcher did, on the node (read back when a test fails).
WATCH_LOG = "/root/staging-watcher.log"


@pytest.fixture(scope="module")
def serving(lab):
    """The whole fleet deployed and answering through the gateway."""
    lab.pyinfra("deploys/full.py", timeout=3600)
    assert chat_through_gateway(lab).status_code == 200


def error_lines(output: str, host: str) -> list[str]:
    """The lines of a run's output that name the host and say it failed (the tool's own lines
    start with `host: `)."""
    return [line.strip() for line in output.splitlines() if host in line and re.search(
        rf"{host}: |did not|cannot|rejected|fails|failed|error|Error|exit", line)]


def all_serving(lab: Lab) -> None:
    """Every instance of every worker active and the gateway answering (several requests,
    so each instance gets some)."""
    for worker in lab.workers:
        states = lab.run(worker, f"systemctl is-active {' '.join(UNITS)}", check=False).stdout.split()
        assert states == ["active", "active"], f"{worker}: {states}"
    assert all(chat_through_gateway(lab).status_code == 200 for _ in range(6))


def converged(lab: Lab, deploy: str, *args: str) -> None:
    """A plain rerun succeeds, and the one after it changes nothing."""
    lab.pyinfra(deploy, *args)
    rerun = lab.pyinfra(deploy, *args)
    again = totals(rerun.stdout)
    assert again["changed"] == 0 and again["errors"] == 0, (again, rerun.stdout[-4000:])


def interrupted(lab: Lab, marker: str, *args: str) -> subprocess.CompletedProcess:
    """Run pyinfra and send it SIGINT (Ctrl-C) as soon as its output shows marker."""
    process = subprocess.Popen([str(BIN / "pyinfra"), "-y", lab.inventory, *args], cwd=PROJECT,
                               env={**lab.env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if marker in line:
            process.send_signal(signal.SIGINT)
            break
    rest, _ = process.communicate(timeout=300)
    output = "".join(seen) + rest
    assert marker in output, output[-3000:]
    return subprocess.CompletedProcess(process.args, process.returncode, output)


def node_watcher(lab: Lab, node: str, start: str, action: str) -> str:
    """Start a watcher on the node that waits (up to 120 s) for a process whose command line starts
    with `start` (a regular expression), then runs action with $p set to its pid; returns the watcher's
    pid. Anchored: a command that only mentions the program (the shell that runs it, a fetch of the same
    file) is not it, and may be gone before the action reaches it."""
    script = (f"for i in $(seq 2400); do p=$(pgrep -f -o -- {shlex.quote('^' + start)}) && break; sleep 0.05; done; "
              f"[ -n \"$p\" ] && {{ {action}; }}")
    return lab.run(node, f"setsid sh -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null & echo $!").stdout.strip()


def staging_watcher(lab: Lab, node: str, action: str) -> str:
    """Start a watcher on the node that waits (up to 10 min) for the stager's first file in its
    incoming directory (it fetches there, in an order of its own, and writes a file in chunks of
    CHUNK_BYTES: a small one lands at once), freezes the stager (SIGSTOP) so nothing more lands
    whatever the link's speed, runs action with $p set to the stager's pid, and lets the stager go
    on (SIGCONT). It logs each step to WATCH_LOG."""
    incoming = f"{V2_PARTIAL}/.incoming"
    script = (f"exec >{WATCH_LOG} 2>&1; "
              f"for i in $(seq 6000); do [ -n \"$(find {incoming} -type f 2>/dev/null)\" ] && break; "
              "sleep 0.1; done; "
              f"p=$(pgrep -o -f '^python3 {WEIGHTS_STAGER}'); "
              "[ -n \"$p\" ] || { echo 'no stager running'; exit 1; }; kill -STOP $p; "
              f"echo \"$(date +%T.%N) stager $p frozen with: $(du -sb {incoming})\"; "
              f"{{ {action}; }}; echo \"$(date +%T.%N) action exit $?\"; kill -CONT $p")
    return lab.run(node, f"setsid sh -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null & echo $!").stdout.strip()


def watcher_log(lab: Lab, node: str) -> str:
    return lab.run(node, f"cat {WATCH_LOG}", check=False).stdout


# Kills the sshd session that runs $p: walks up from $p to the first sshd process.
KILL_SSH_SESSION = ("q=$p; while [ \"$q\" -gt 1 ] && [ \"$(cat /proc/$q/comm)\" != sshd ]; do "
                    "q=$(awk '{print $4}' /proc/$q/stat); done; [ \"$q\" -gt 1 ] && kill -KILL $q")


def host_link(lab: Lab, node: str) -> str:
    """The host side of the node's veth (the lab's link to it)."""
    peer = re.search(r"eth0@if(\d+)", lab_ip(lab, node, "-o", "link", "show", "eth0"))[1]
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                          check=True).stdout.split(f"\n{peer}: ")[1].split("@")[0]


def lab_ip(lab: Lab, node: str, *args: str) -> str:
    return subprocess.run(["ip", "-n", f"af-{lab.name}-{node}", *args], capture_output=True, text=True,
                          check=True).stdout


@contextmanager
def slow_link(lab: Lab, node: str, rate: str = "1mbit"):
    """Traffic to the node at `rate` (the 4.5 MB model then takes half a minute to fetch)."""
    link = host_link(lab, node)
    subprocess.run(["tc", "qdisc", "replace", "dev", link, "root", "tbf", "rate", rate, "burst", "32kb",
                    "latency", "2s"], check=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", link, "root"], check=False)


def unit_state(lab: Lab, node: str, unit: str) -> dict[str, str]:
    out = lab.run(node, f"systemctl show -p ActiveState -p SubState -p NRestarts {unit}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def hand_install(lab: Lab, node: str, package: str) -> None:
    """What an operator's hand install leaves: a vendor package from the mirror installed over what
    the deploy put there (active at the next reboot)."""
    lab.run(node, f"cd /root && curl -fsS -O {lab.mirror_url}/files/{package} && chmod +x {package} && "
                  f"./{package} --nox11 --upgrade --quiet </dev/null >/dev/null; rc=$?; rm -f {package}; "
                  "[ $rc = 0 ] || [ $rc = 2 ]")


def test_an_instance_that_crash_loops_stops_retrying_is_routed_around_and_shown(lab, serving):
    unit = UNITS[1]
    # Another process waits for vllm-1's first NPU; when vLLM dies it takes the NPU, so every
    # restart systemd makes fails on it.
    holder = lab.run("worker1", "setsid sh -c 'exec 3<>/dev/davinci4; flock -x 3; exec sleep 900' "
                                ">/dev/null 2>&1 </dev/null & echo $!").stdout.strip()
    try:
        lab.run("worker1", f"kill -KILL $(systemctl show -P MainPID {unit})")
        # systemd gives up (failed, no restart scheduled) within StartLimitBurst starts, 10 s apart.
        deadline = time.monotonic() + 120
        while unit_state(lab, "worker1", unit)["SubState"] != "failed":
            assert time.monotonic() < deadline, unit_state(lab, "worker1", unit)
            time.sleep(2)
        time.sleep(15)  # longer than RestartSec: no further start comes
        state = unit_state(lab, "worker1", unit)
        burst = int(lab.run("worker1", f"systemctl show -P StartLimitBurst {unit}").stdout)
        # NRestarts also counts the restart systemd queued and then refused at the start limit.
        assert state["ActiveState"] == "failed" and int(state["NRestarts"]) <= burst + 1, state
        assert all(chat_through_gateway(lab).status_code == 200 for _ in range(8))  # routed around it
        status = lab.cli("status", lab.inventory, "--json", check=False)
        assert status.returncode == 1
        shown = status.stdout[status.stdout.index('"worker1"'):]
        assert "failed/failed" in shown and "NPU 4" in shown and "already in use" in shown, shown[:3000]
        # A deploy while the NPU is still held starts the unit again, and says why it did not start.
        result = lab.pyinfra("deploys/serve.py", "--limit", "worker1", check=False)
        assert result.returncode != 0
        line = next(line for line in error_lines(result.stdout, "worker1") if "did not start" in line)
        assert f"{unit} did not start: " in line and "NPU 4" in line and "already in use" in line, line
    finally:
        lab.run("worker1", f"kill {holder}", check=False)
    converged(lab, "deploys/serve.py", "--limit", "worker1")
    all_serving(lab)


def test_a_gateway_config_nginx_rejects_keeps_the_old_one_serving(lab, serving):
    # An operator's leftover file defines the same upstream, so any new config fails nginx -t;
    # the hand edit makes the deployed config differ from what the gateway stage renders.
    lab.run("gateway", f"echo 'upstream vllm_backend {{ server 127.0.0.1:9; }}' > {LEFTOVER_CONFIG}; "
                       f"echo '# edited by hand' >> {GATEWAY_CONFIG}")
    try:
        before = lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout
        result = lab.pyinfra("deploys/gateway.py", check=False)
        assert result.returncode != 0
        line = next(line for line in error_lines(result.stdout, "gateway") if "rejected" in line)
        assert "previous one keeps serving" in line and 'duplicate upstream "vllm_backend"' in line, line
        assert lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout == before
        assert lab.run("gateway", f"ls {GATEWAY_CONFIG}.new {GATEWAY_CONFIG}.previous", check=False).returncode != 0
        all_serving(lab)
    finally:
        lab.run("gateway", f"rm -f {LEFTOVER_CONFIG}")
    converged(lab, "deploys/gateway.py")
    assert "edited by hand" not in lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout


def test_a_vendor_mirror_that_is_down_stops_the_fetch_with_one_line(lab, serving):
    # The lab profile's toolkit: the cache may also hold the previous profile's (tests below install it).
    toolkit = load_profile("lab").vendor_files(lab.run("worker1", "uname -m").stdout.strip())["toolkit"]
    assert toolkit in lab.run("worker1", f"ls {PACKAGE_DIR}").stdout.split()
    installed = lab.run("worker1", "cat /usr/local/Ascend/cann/*-linux/ascend_toolkit_install.info").stdout
    down = re.sub(r":\d+$", ":9", lab.mirror_url)  # the mirror's address, nothing listening
    mirror_down = ("deploys/cann.py", "--limit", "worker1", "--data", f"vendor_mirror_url={down}/files")
    # While another worker holds the package, the mirror being down costs nothing: a peer sends it.
    lab.run("worker1", f"rm {PACKAGE_DIR}/{toolkit}")
    lab.pyinfra(*mirror_down)
    assert toolkit in lab.run("worker1", f"ls {PACKAGE_DIR}").stdout.split()
    # Once no worker holds it, the CANN stage must fetch it from the mirror, which is down.
    for worker in lab.workers:
        lab.run(worker, f"rm -f {PACKAGE_DIR}/{toolkit}")
    result = lab.pyinfra(*mirror_down, check=False)
    assert result.returncode != 0
    line = next(line for line in error_lines(result.stdout, "worker1") if "cannot download" in line)
    assert toolkit in line and "vendor mirror is up" in line, line
    assert lab.run("worker1", f"ls {PACKAGE_DIR}").stdout.split().count(f"{toolkit}.partial") == 0
    assert lab.run("worker1", "cat /usr/local/Ascend/cann/*-linux/ascend_toolkit_install.info").stdout == installed
    all_serving(lab)
    converged(lab, "deploys/cann.py", "--limit", "worker1")


def test_ssh_dropped_during_a_cann_install_then_a_rerun_converges(lab, serving):
    # The installer under its time limit (operations/vendor.installer_command); the fetch of the same file
    # and the shell around both name it too (the watcher once took the fetch, gone before it acted).
    watcher = node_watcher(lab, "worker1", f"timeout [0-9]+ {PACKAGE_DIR}/{PREVIOUS_TOOLKIT}", KILL_SSH_SESSION)
    try:
        result = lab.pyinfra("deploys/cann.py", "--limit", "worker1", "--data", "profile=lab-previous", check=False)
    finally:
        lab.run("worker1", f"kill {watcher}", check=False)
    assert result.returncode != 0
    assert error_lines(result.stdout, "worker1"), result.stdout[-3000:]
    assert "Starting operation: CANN | CANN kernels" not in result.stdout  # the run stopped at the toolkit
    all_serving(lab)
    converged(lab, "deploys/cann.py", "--limit", "worker1", "--data", "profile=lab-previous")
    # Back to the profile's CANN: the same stage, the lab's own data.
    converged(lab, "deploys/cann.py", "--limit", "worker1")
    all_serving(lab)


def test_ssh_dropped_during_a_weight_download_then_a_rerun_resumes(lab, serving):
    lab.run("worker1", f"rm -rf {V2_DIR} {V2_PARTIAL}")  # v2 to fetch (test_weights.py stages it on the session lab)
    watcher = staging_watcher(lab, "worker1", KILL_SSH_SESSION)
    try:
        with slow_link(lab, "worker1"):
            result = lab.pyinfra("deploys/weights.py", "--limit", "worker1", "--data", f"model={V2}", check=False)
    finally:
        lab.run("worker1", f"kill {watcher}", check=False)
    try:
        assert result.returncode != 0, watcher_log(lab, "worker1")
        assert error_lines(result.stdout, "worker1"), result.stdout[-3000:]
        # Nothing unfinished is published: v2 is either absent or complete with its marker.
        listing = lab.run("worker1", f"ls -A {V2_DIR} 2>/dev/null; true").stdout.split()
        assert not listing or MARKER_NAME in listing
        all_serving(lab)
        converged(lab, "deploys/weights.py", "--limit", "worker1", "--data", f"model={V2}")
        assert MARKER_NAME in lab.run("worker1", f"ls -A {V2_DIR}").stdout
    finally:
        lab.run("worker1", f"rm -rf {V2_DIR} {V2_PARTIAL}")


def test_the_nvme_filling_up_during_weight_staging_stops_with_one_line(lab, serving):
    fill = "fallocate -l $(($(findmnt -n -o AVAIL -b --target /mnt/nvme) - 65536)) /mnt/nvme/filler"
    lab.run("worker2", f"rm -rf {V2_DIR} {V2_PARTIAL}")  # v2 to fetch (test_weights.py stages it on the session lab)
    watcher = staging_watcher(lab, "worker2", fill)
    try:
        try:
            with slow_link(lab, "worker2"):
                result = lab.pyinfra("deploys/weights.py", "--limit", "worker2", "--data", f"model={V2}",
                                     check=False)
            assert result.returncode != 0, watcher_log(lab, "worker2")
            line = next(line for line in error_lines(result.stdout, "worker2") if "Qwen3-Tiny@v2" in line)
            assert "No space left" in line, line
            assert lab.run("worker2", f"test -e {V2_DIR}", check=False).returncode != 0
            all_serving(lab)
        finally:
            lab.run("worker2", f"kill {watcher}; rm -f /mnt/nvme/filler", check=False)
        converged(lab, "deploys/weights.py", "--limit", "worker2", "--data", f"model={V2}")
    finally:
        lab.run("worker2", f"rm -rf {V2_DIR} {V2_PARTIAL}")


def completion_on_node(lab: Lab, node: str, port: int) -> str:
    """What one instance generates for a fixed prompt, asked on its node (the instance firewall keeps this
    machine off its port). The simulated vLLM generates from the tensors it read at start, as vLLM does."""
    body = json.dumps({"model": "lab/Qwen3-Tiny", "prompt": "Ascend", "max_tokens": 12, "temperature": 0,
                       "ignore_eos": True})
    out = lab.run(node, f"curl -fsS -H 'Content-Type: application/json' -d {shlex.quote(body)} "
                        f"http://127.0.0.1:{port}/v1/completions").stdout
    return json.loads(out)["choices"][0]["text"]


# Flips the byte in the middle of the file (tensor data, past the header) in place, then gives the file
# back the mtime it had: what silent corruption leaves, nothing a size or mtime check can see.
FLIP_KEEPING_SIZE_AND_MTIME = (
    "f={path}; cp -p $f /root/mtime-ref && python3 -c \"import os, sys; f = open(sys.argv[1], 'r+b'); "
    "n = os.path.getsize(sys.argv[1]) // 2; f.seek(n); b = f.read(1); f.seek(n); f.write(bytes([b[0] ^ 255]))\" $f "
    "&& touch -r /root/mtime-ref $f && rm /root/mtime-ref")


def test_a_flipped_byte_in_a_staged_shard_is_found_by_the_deep_verify_restaged_and_served_right(lab, serving):
    shard = "model-00001-of-00002.safetensors"
    right = {port: completion_on_node(lab, "worker2", port) for port in (8000, 8001)}
    before = lab.run("worker2", f"stat -c '%s %Y' {V1_DIR}/{shard}").stdout
    lab.run("worker2", FLIP_KEEPING_SIZE_AND_MTIME.format(path=f"{V1_DIR}/{shard}"))
    assert lab.run("worker2", f"stat -c '%s %Y' {V1_DIR}/{shard}").stdout == before
    # vllm-0 starts again (as after a reboot) and loads the bad shard: it now generates otherwise;
    # vllm-1 read its weights before the flip and still answers as it did.
    lab.run("worker2", f"systemctl restart {UNITS[0]}")
    assert completion_on_node(lab, "worker2", 8000) != right[8000]
    assert completion_on_node(lab, "worker2", 8001) == right[8001]

    deep = lab.pyinfra("deploys/verify.py", "--data", "weights_deep_verify=true", check=False)

    assert deep.returncode != 0
    found = [line for line in error_lines(deep.stdout, "worker2") if shard in line]
    assert found and "worker2: weights lab/Qwen3-Tiny@v1: " in found[0] and "does not match the manifest" in found[0]
    assert not any(shard in line for worker in ("worker1", "worker3") for line in error_lines(deep.stdout, worker))
    status = lab.cli("status", lab.inventory, "--json", check=False)
    problems = next(h for h in json.loads(status.stdout)["hosts"] if h["host"] == "worker2")["problems"]
    assert status.returncode == 1 and any(shard in problem and "deep verify" in problem for problem in problems)

    starts = unit_starts(lab, "worker2")
    failed, stop = [], threading.Event()

    def clients() -> None:  # what clients see through the gateway while worker2 restarts onto the fix
        while not stop.is_set():
            reply = chat_through_gateway(lab)
            if reply.status_code != 200:
                failed.append(reply.status_code)
            time.sleep(0.2)

    load = threading.Thread(target=clients)
    load.start()
    try:
        lab.pyinfra("deploys/full.py", "--limit", "worker2")
    finally:
        stop.set()
        load.join()

    assert failed == []  # restarted one at a time while the others serve (the serve stage's routed restart)
    manifest = json.loads(lab.run("worker2", f"cat {V1_DIR}/{MARKER_NAME}").stdout)["files"]
    assert lab.run("worker2", f"sha256sum {V1_DIR}/{shard}").stdout.split()[0] == manifest[shard]["sha256"]
    record = json.loads(lab.run("worker2", f"cat {V1_DIR}/{DEEP_VERIFY_NAME}").stdout)
    assert record["mismatched"] == {} and record["restages"] == 1
    assert all(unit_starts(lab, "worker2")[unit] != starts[unit] for unit in UNITS)
    assert {port: completion_on_node(lab, "worker2", port) for port in (8000, 8001)} == right
    status = lab.cli("status", lab.inventory, "--json", check=False)
    problems = next(h for h in json.loads(status.stdout)["hosts"] if h["host"] == "worker2")["problems"]
    assert not any("deep verify" in problem for problem in problems), problems
    again = totals(lab.pyinfra("deploys/serve.py", "--limit", "worker2").stdout)
    assert again["changed"] == 0, again  # restarted once, not on every run
    all_serving(lab)


def test_sigint_during_the_serve_stage_then_a_rerun_converges(lab, serving):
    # A changed environment restarts worker1's instances; Ctrl-C lands during the first restart.
    env = json.dumps({"OMP_NUM_THREADS": 2, "HCCL_BUFFSIZE": 256})
    result = interrupted(lab, "Starting operation: Serve | Instance vllm-0 serving",
                         "deploys/serve.py", "--limit", "worker1", "--data", f"npu_env={env}")
    assert "Exiting upon user request!" in result.stdout  # pyinfra's word for it (and exit code 0)
    assert all(chat_through_gateway(lab).status_code == 200 for _ in range(6))
    converged(lab, "deploys/serve.py", "--limit", "worker1")
    all_serving(lab)


def test_sigint_during_the_driver_stage_then_a_rerun_converges(lab, serving):
    # Ctrl-C once worker1's firmware and driver for the previous stack are installed, as its reboot
    # begins: the rerun of the same command must finish the job (the reboot), then the lab's own
    # stack comes back.
    result = interrupted(lab, "Starting operation: NPU driver and firmware | Reboot to load the new driver",
                         "deploys/driver.py", "--limit", "worker1", "--data", "profile=lab-previous")
    assert "Exiting upon user request!" in result.stdout
    assert all(chat_through_gateway(lab).status_code == 200 for _ in range(6))
    converged(lab, "deploys/driver.py", "--limit", "worker1", "--data", "profile=lab-previous")
    assert "24.1.0" in lab.run("worker1", "npu-smi info").stdout  # the previous driver is the one loaded
    converged(lab, "deploys/driver.py", "--limit", "worker1")
    assert "25.2.0" in lab.run("worker1", "npu-smi info").stdout
    converged(lab, "deploys/serve.py", "--limit", "worker1")
    all_serving(lab)


def test_firmware_outside_the_drivers_range_is_replaced_and_the_node_serves_again(lab, serving):
    hand_install(lab, "worker3", PREVIOUS_FIRMWARE)  # 7.5: outside driver 25.2.0's 7.7 range
    lab.reboot("worker3")
    assert "dcmi module initialize failed" in lab.run("worker3", "npu-smi info 2>&1", check=False).stdout
    # Preflight lets it through (no driver answers, so the PCI bus counts the NPUs); the driver
    # stage puts the profile's firmware back and reboots once.
    boots = {n["name"]: n["boots"] for n in lab.status()["nodes"]}["worker3"]
    converged(lab, "deploys/full.py", "--limit", "worker3")
    assert {n["name"]: n["boots"] for n in lab.status()["nodes"]}["worker3"] == boots + 1
    assert "7.7.0.6.236" in lab.run("worker3", "npu-smi info -t board -i 0").stdout
    all_serving(lab)


def test_a_node_that_does_not_come_back_from_its_reboot_is_reported_and_the_others_complete(lab, serving):
    hand_install(lab, "worker3", PREVIOUS_FIRMWARE)  # so the driver stage reinstalls it and reboots worker3 only
    hold = lab.lab_dir / "nodes" / "worker3" / "hold"
    hold.touch()
    try:
        started = time.monotonic()
        result = lab.pyinfra("deploys/driver.py", "--limit", "workers", "--data", "reboot_timeout=20", check=False)
        elapsed = time.monotonic() - started
        assert result.returncode != 0
        line = next(line for line in error_lines(result.stdout, "worker3") if "did not come back" in line)
        assert "within 20s" in line and "rerun" in line, line
        assert elapsed < 240, f"the run took {elapsed:.0f}s"
        # worker1 and worker2 went through the whole stage, up to its last check.
        gate = result.stdout.split("Starting operation: NPU driver and firmware | Every NPU listed and healthy")[1]
        answers = gate.split("-->")[0]
        assert "[worker1] No changes" in answers and "[worker2] No changes" in answers, answers
        assert all(chat_through_gateway(lab).status_code == 200 for _ in range(6))
    finally:
        hold.unlink(missing_ok=True)
    lab.wait_running("worker3", timeout=180)
    converged(lab, "deploys/driver.py", "--limit", "worker3")
    assert "7.7.0.6.236" in lab.run("worker3", "npu-smi info -t board -i 0").stdout
    all_serving(lab)


def test_an_npu_turning_unhealthy_after_preflight_gets_no_instance_restarted_on_it(lab, serving):
    before = unit_starts(lab, "worker3")
    original = rewrite_hardware(lab, "worker3", npu_health=["OK"] * 5 + ["Critical"] + ["OK"] * 2)
    try:
        # The serve stage alone (preflight passed long ago), with a change that would restart both instances.
        env = json.dumps({"OMP_NUM_THREADS": 2, "HCCL_BUFFSIZE": 256})
        result = lab.pyinfra("deploys/serve.py", "--limit", "worker3", "--data", f"npu_env={env}", check=False)
    finally:
        restore_hardware(lab, "worker3", original)
    assert result.returncode != 0
    line = next(line for line in error_lines(result.stdout, "worker3") if "unhealthy" in line)
    assert "NPU 5 Critical" in line and "replace or drain the card" in line, line
    assert unit_starts(lab, "worker3") == before
    all_serving(lab)
    converged(lab, "deploys/serve.py", "--limit", "worker3")
    assert unit_starts(lab, "worker3") == before


def test_a_driver_installed_but_never_rebooted_is_rebooted_by_the_rerun(lab, serving):
    # What a run stopped between its installs and their reboot leaves (Ctrl-C, SSH lost): the
    # previous stack's firmware and driver installed, the lab's still loaded, npu-smi failing.
    for package in (PREVIOUS_FIRMWARE, PREVIOUS_DRIVER):
        hand_install(lab, "worker1", package)
    assert "dcmi module initialize failed" in lab.run("worker1", "npu-smi info 2>&1", check=False).stdout
    boots = {n["name"]: n["boots"] for n in lab.status()["nodes"]}["worker1"]
    # Both installed versions match lab-previous: only the driver that is not loaded asks for the reboot.
    converged(lab, "deploys/driver.py", "--limit", "worker1", "--data", "profile=lab-previous")
    assert {n["name"]: n["boots"] for n in lab.status()["nodes"]}["worker1"] == boots + 1
    assert "24.1.0" in lab.run("worker1", "npu-smi info").stdout
    converged(lab, "deploys/driver.py", "--limit", "worker1")
    assert "25.2.0" in lab.run("worker1", "npu-smi info").stdout
    converged(lab, "deploys/serve.py", "--limit", "worker1")
    all_serving(lab)
