"""The package's operations at command level: what each yields for a node's state (a FakeHost's facts),
and that a node with nothing to do gets no command and is told so. Shell commands that only touch
files run for real in a temp directory, with stand-ins for the programs they call."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.facts.files import Directory, File, Sha1File, Sha256File
from pyinfra.facts.server import Groups, Os, Users, Which
from pyinfra.facts.systemd import SystemdEnabled

from ascend_fleet.config.fleetstate import FleetState
from ascend_fleet.core.node_layout import SERVICE_ENV_FILE, SERVICE_HOME, SYSTEMD_DIR, instance_unit, unit_file
from ascend_fleet.facts.accounts import Account
from ascend_fleet.facts.ascend import SourcedEnvironment
from ascend_fleet.facts.files import FileState
from ascend_fleet.facts.firewall import NftTableComment
from ascend_fleet.facts.systemd import UnitState
from ascend_fleet.operations import (
    accounts,
    config,
    environment,
    firewall,
    gates,
    gateway,
    placed,
    served,
    units,
    vendor,
)
from tests.fakehost import FakeHost, commands, fact, new_file, on, uploaded, uploads

# Stand-ins for what the operations' shell commands call: each logs its call to $CALLS.
STUBS = {
    # A start or restart fails as $START_FAILS says: "pre" (the start check, no new main process) or
    # "main" (a new main process, pid 200, exited 1). The main pid is 100 until a start.
    "systemctl": ('case "$1" in is-active) [ -n "$ACTIVE" ];; '
                  'start|restart) [ "$START_FAILS" = pre ] || echo 200 > "$CALLS.main"; [ -z "$START_FAILS" ] || { '
                  'echo "Job for $2 failed because the control process exited with error code." >&2; exit 1; };; '
                  'show) case "$3" in ExecMainPID) cat "$CALLS.main" 2>/dev/null || echo 100;; '
                  'ExecMainStatus) [ -n "$START_FAILS" ] && echo 1 || echo 0;; esac;; esac'),
    # The journal: $MAIN_LINE for the main process's lines (_PID=), else $UNIT_LINE. As journald 252
    # does (seen on a lab node), --since with -n 1 and no -r answers the first line after it.
    "journalctl": ('case " $* " in *" --sync "*) exit;; esac; '
                   'case " $* " in *" --since "*) case " $* " in *" -r "*) ;; '
                   '*) echo "INFO first line"; exit;; esac;; esac; '
                   'case "$*" in *_PID=*) echo "$MAIN_LINE";; *) echo "$UNIT_LINE";; esac'),
    "nginx": ('if grep -q bad "$CONFIG"; then echo "nginx: [emerg] unknown directive \\"bad\\" in $CONFIG:1" >&2; '
              'echo "nginx: configuration file /etc/nginx/nginx.conf test failed" >&2; exit 1; fi'),
    "nft": ('if [ "$1" = -c ] && grep -q bad "$3"; then '
            'echo "$3:2:1-3: Error: syntax error, unexpected bad" >&2; exit 1; fi'),
    "sleep": "",
}


class Node:
    """A node's files in a temp directory. Its PATH has the stubs and not /usr/sbin, so no real
    service or firewall is ever touched."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, body in STUBS.items():
            (self.bin / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "$CALLS"\n{body}\n')
            (self.bin / name).chmod(0o755)
        self.calls_file = root / "calls"
        self.calls_file.touch()

    def path(self, name: str) -> str:
        return str(self.root / name)

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines()

    def run(self, steps: list, **env: str) -> subprocess.CompletedProcess | None:
        """Carry out the steps as pyinfra would, up to the first that fails; return the last shell run."""
        environ = {"PATH": f"{self.bin}:/usr/bin:/bin", "CALLS": str(self.calls_file), **env}
        result = None
        for step in steps:
            if isinstance(step, FileUploadCommand):
                Path(step.dest).write_bytes(uploaded(step))
                continue
            script = step.get_raw_value() if isinstance(step, StringCommand) else step
            result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=environ, timeout=60)
            if result.returncode != 0:
                break
        return result


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- config, gateway


def config_node(node: Node, dest: str, serving: str | None) -> FakeHost:
    if serving is not None:
        Path(dest).write_text(serving)
    return FakeHost({fact(Sha256File, path=dest): serving and sha256(serving), **new_file(f"{dest}.new")})


def test_a_config_that_already_has_this_content_yields_no_command_and_says_so(node):
    dest = node.path("site.conf")
    fake = config_node(node, dest, "listen 80;\n")
    assert commands(config.checked_config, fake, dest=dest, content="listen 80;\n", check="false", service="x",
                    what="site config") == []
    assert fake.noops == [f"{dest} is current"]


def test_a_new_config_the_checker_accepts_replaces_the_old_and_reloads_the_running_service(node):
    dest = node.path("gateway.conf")
    steps = commands(gateway.nginx_config, config_node(node, dest, "upstream old;\n"), dest=dest,
                     content="upstream new;\n")
    result = node.run(steps, CONFIG=dest, ACTIVE="yes")
    assert result.returncode == 0, result.stderr
    assert Path(dest).read_text() == "upstream new;\n"
    assert node.calls() == ["nginx -t", "systemctl is-active --quiet nginx", "systemctl reload nginx"]
    assert sorted(p.name for p in node.root.glob("gateway.conf*")) == ["gateway.conf"]  # no .new, no .previous


def test_a_config_nginx_t_rejects_is_swapped_back_out_and_nginx_is_not_reloaded(node):
    dest = node.path("gateway.conf")
    steps = commands(gateway.nginx_config, config_node(node, dest, "upstream old;\n"), dest=dest,
                     content="bad;\n")
    result = node.run(steps, CONFIG=dest, ACTIVE="yes")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "new gateway config rejected by nginx -t, the previous one keeps serving: "
        f"nginx: [emerg] unknown directive \"bad\" in {dest}:1"]
    assert Path(dest).read_text() == "upstream old;\n"
    assert node.calls() == ["nginx -t"]
    assert sorted(p.name for p in node.root.glob("gateway.conf*")) == ["gateway.conf"]


def test_a_rejected_first_config_leaves_no_file_and_an_accepted_one_starts_the_stopped_service(node):
    dest = node.path("rules.yml")
    check = f"grep -q good {dest}"
    rejected = commands(config.checked_config, config_node(node, dest, None), dest=dest, content="bad\n",
                        check=check, service="prometheus", what="alert rules")
    assert node.run(rejected).returncode == 1 and not Path(dest).exists()
    accepted = commands(config.checked_config, config_node(node, dest, None), dest=dest, content="good\n",
                        check=check, service="prometheus", what="alert rules")
    assert node.run(accepted).returncode == 0 and Path(dest).read_text() == "good\n"
    assert node.calls()[-1] == "systemctl start prometheus"


def test_the_gateway_config_is_made_when_the_operation_runs_not_when_it_is_called(node):
    dest = node.path("gateway.conf")
    backends = ["worker1/vllm-0"]
    with on(config_node(node, dest, None)):
        steps = gateway.nginx_config._inner(dest=dest, content=lambda: " ".join(backends))
        backends.append("worker2/vllm-0")  # recorded by the run's serve stage meanwhile
        assert uploads(list(steps)) == {f"{dest}.new": b"worker1/vllm-0 worker2/vllm-0"}


# ---------------------------------------------------------------- environment


def test_the_service_environment_drops_cuda_and_the_settings_win_over_what_cann_sets():
    scripts, venv = ["/usr/local/Ascend/cann/set_env.sh"], "/opt/vllm"
    captured = {"LD_LIBRARY_PATH": "/usr/local/Ascend/cann/lib64:/usr/local/cuda/lib64", "CUDA_HOME": "/usr/local/cuda",
                "HCCL_BUFFSIZE": "120", "ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/cann"}
    dest = SERVICE_ENV_FILE
    fake = FakeHost({fact(SourcedEnvironment, scripts=scripts, venv=venv): captured, **new_file(dest)})
    steps = commands(environment.service_env_file, fake, dest=dest, env_scripts=scripts, venv=venv,
                     settings={"HCCL_BUFFSIZE": "512"})
    lines = [line for line in uploads(steps)[dest].decode().splitlines() if line and not line.startswith("#")]
    assert sorted(lines) == ["ASCEND_TOOLKIT_HOME=/usr/local/Ascend/cann", "HCCL_BUFFSIZE=512",
                             "LD_LIBRARY_PATH=/usr/local/Ascend/cann/lib64"]


# ---------------------------------------------------------------- files put whole

UNIT_PATH = unit_file(instance_unit("vllm-0"))
UNIT_TEXT = "[Unit]\nDescription=vllm-0\n"
AS_WANTED = {"user": "root", "group": "root", "mode": 644, "sha256": hashlib.sha256(UNIT_TEXT.encode()).hexdigest()}


def test_a_file_as_wanted_is_read_with_one_fact_and_left_alone():
    fake = FakeHost({fact(FileState, path=UNIT_PATH): AS_WANTED})  # any other fact read raises KeyError
    assert commands(placed.file, fake, dest=UNIT_PATH, content=UNIT_TEXT, mode="644", user="root") == []
    assert fake.noops == [f"{UNIT_PATH} is current"]


@pytest.mark.parametrize("differs", [{"sha256": "0" * 64}, {"mode": 664}, {"user": "vllm"}])
def test_a_file_whose_content_mode_or_owner_differs_is_put_again_whole(differs):
    on_node = {**AS_WANTED, **differs}
    fake = FakeHost({fact(FileState, path=UNIT_PATH): on_node, fact(File, path=UNIT_PATH): on_node,
                     Sha1File: "0" * 40, fact(Directory, path=SYSTEMD_DIR): {"mode": 755}})
    steps = commands(placed.file, fake, dest=UNIT_PATH, content=UNIT_TEXT, mode="644", user="root")
    assert uploads(steps) == {UNIT_PATH: UNIT_TEXT.encode()}


def test_file_state_reads_a_real_files_owner_mode_and_sha256_and_nothing_of_what_is_not_a_file(tmp_path):
    def read(path: Path):
        command = FileState().command(str(path)).get_raw_value()
        return FileState().process(subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                                  check=True).stdout.splitlines())

    unit = tmp_path / "it's a $(unit);\n100% \\ file"  # quoted whole: nothing in a path runs
    unit.write_text(UNIT_TEXT)
    unit.chmod(0o640)
    me = Path(tmp_path).owner()
    assert read(unit) == {"user": me, "group": Path(tmp_path).group(), "mode": 640, "sha256": AS_WANTED["sha256"]}
    assert read(tmp_path / "missing") is None and read(tmp_path) is None


# ---------------------------------------------------------------- firewall


def nft_node(path: str, on_disk: str | None, loaded_comment: str | None) -> FakeHost:
    return FakeHost({fact(Sha256File, path=path): on_disk and sha256(on_disk),
                     fact(NftTableComment, family="inet", table="ascend_fleet"): loaded_comment,
                     **new_file(f"{path}.new")})


def nft_table(fake: FakeHost, path: str, rules: str) -> list:
    return commands(firewall.nft_table, fake, path=path, rules=rules, family="inet", table="ascend_fleet",
                    comment="rules-2")


def test_rules_on_disk_and_loaded_yield_no_command(node):
    path = node.path("ascend-fleet.nft")
    fake = nft_node(path, "rules 2\n", "rules-2")
    assert nft_table(fake, path, "rules 2\n") == [] and fake.noops == [
        f"nftables table inet ascend_fleet is loaded from {path}"]


@pytest.mark.parametrize("on_disk, loaded_comment", [("rules 2\n", None), ("rules 1\n", "rules-2")],
                         ids=["not loaded (flushed)", "another file than the loaded rules (what boot loads)"])
def test_rules_not_both_on_disk_and_loaded_are_written_checked_and_loaded(node, on_disk, loaded_comment):
    path = node.path("ascend-fleet.nft")
    Path(path).write_text(on_disk)
    result = node.run(nft_table(nft_node(path, on_disk, loaded_comment), path, "rules 2\n"))
    assert result.returncode == 0 and node.calls() == [f"nft -c -f {path}.new", f"nft -f {path}"]
    assert Path(path).read_text() == "rules 2\n"


def test_rules_nft_refuses_are_not_kept_and_the_loaded_ones_stay(node):
    path = node.path("ascend-fleet.nft")
    Path(path).write_text("rules 1\n")
    result = node.run(nft_table(nft_node(path, "rules 1\n", "rules-1"), path, "table\nbad\n"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"worker1: `nft -c` refused the rules for {path}, nothing changed: "
        f"{path}.new:2:1-3: Error: syntax error, unexpected bad"]
    assert Path(path).read_text() == "rules 1\n" and not Path(f"{path}.new").exists()
    assert node.calls() == [f"nft -c -f {path}.new"]  # never loaded


@pytest.mark.parametrize("loaded, on_disk, expected", [
    ("rules-2", "sha", ["nft delete table inet ascend_fleet", "rm -f /etc/nftables.d/ascend-fleet.nft"]),
    (None, "sha", ["rm -f /etc/nftables.d/ascend-fleet.nft"]),  # not loaded (nft flushed): only the file goes
    (None, None, []),
], ids=["loaded", "file only", "neither"])
def test_a_table_taken_out_is_deleted_only_when_loaded_and_its_file_removed(loaded, on_disk, expected):
    path = "/etc/nftables.d/ascend-fleet.nft"
    fake = FakeHost({NftTableComment: loaded, Sha256File: on_disk})
    assert commands(firewall.nft_table_absent, fake, path=path, family="inet", table="ascend_fleet") == expected
    assert bool(fake.noops) is not bool(expected)


# ---------------------------------------------------------------- gates


def never_called() -> str | None:
    raise AssertionError("the gate ran while pyinfra was preparing the deploy")


def test_a_gate_checks_nothing_while_the_deploy_is_prepared():
    fake = FakeHost(executing=False)
    assert commands(gates.passed, fake, description="8 NPUs healthy", find_problem=never_called) == []
    assert fake.noops == ["8 NPUs healthy (checked when the deploy runs)"]


def test_a_gate_that_finds_no_problem_passes_and_says_what_holds(caplog):
    fake = FakeHost()
    assert commands(gates.passed, fake, description="8 NPUs healthy", find_problem=lambda: None) == []
    assert fake.noops == ["8 NPUs healthy"]
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert commands(gates.passed, fake, description=lambda: "6 of 8 NPUs checked", find_problem=lambda: None) == []
    assert "[worker1] 6 of 8 NPUs checked" in caplog.messages


def test_a_gate_that_finds_a_problem_stops_the_host_with_its_one_line_as_written(node):
    problem = "NPU 3's health is 'Alarm': see `npu-smi info` ($HOME untouched)"
    steps = commands(gates.passed, FakeHost(name="worker7"), description="8 NPUs healthy", find_problem=lambda: problem)
    result = node.run(steps)
    assert result.returncode == 1 and result.stderr == f"worker7: {problem}\n"


# A failed completion's JSON body, as the instance gate quotes it: JSON escapes its newlines.
BACKSLASHED = 'instance vllm-0 (port 8000) a completion answers 400: {"message": "prompt too long:\\nmax 4096"}'


@pytest.mark.skipif(not shutil.which("dash"), reason="the node's sh is dash on Debian and Ubuntu")
@pytest.mark.parametrize("operation, arguments", [
    (gates.passed, {"description": "vllm-0 serves"}),
    (served.instance_served, {"instance": "vllm-0"}),
], ids=["gates.passed", "served.instance_served"])
def test_a_problem_line_with_a_backslash_reaches_the_operator_as_written(node, operation, arguments):
    if operation is served.instance_served:
        arguments = {**arguments, "fleet_state_dir": node.path("fleet-state")}
    (step,) = commands(operation, FakeHost(), find_problem=lambda: BACKSLASHED, **arguments)
    result = subprocess.run(["dash", "-c", step], capture_output=True, text=True)
    assert result.stderr == f"worker1: {BACKSLASHED}\n"


def test_a_stage_mark_changes_nothing_and_names_the_stage():
    fake = FakeHost(executing=False)
    assert commands(gates.stage_begins, fake, stage="serve") == [] and fake.noops == ["stage serve"]


# ---------------------------------------------------------------- served


def test_an_instance_enters_the_served_record_only_when_its_gate_passes_and_leaves_it_when_it_fails(node):
    state_dir = node.path("fleet-state")
    FleetState(state_dir).set_served("worker1", {"vllm-1"})
    passing = FakeHost()
    assert commands(served.instance_served, passing, fleet_state_dir=state_dir, instance="vllm-0",
                    find_problem=lambda: None) == []
    assert FleetState(state_dir).served() == {"worker1": {"vllm-0", "vllm-1"}}
    assert passing.noops == ["vllm-0 served: the gateway routes to it"]
    failing = commands(served.instance_served, FakeHost(), fleet_state_dir=state_dir, instance="vllm-1",
                       find_problem=lambda: "vllm-1 did not answer /health")
    assert FleetState(state_dir).served() == {"worker1": {"vllm-0"}}
    result = node.run(failing)
    assert result.returncode == 1 and result.stderr == "worker1: vllm-1 did not answer /health\n"


def test_the_served_record_is_not_touched_while_the_deploy_is_prepared(node):
    state_dir = node.path("fleet-state")
    assert commands(served.instance_served, FakeHost(executing=False), fleet_state_dir=state_dir, instance="vllm-0",
                    find_problem=never_called) == []
    assert commands(served.instances_out_of_service, FakeHost(executing=False), fleet_state_dir=state_dir,
                    still_serving=never_called, why="restarting") == []
    assert not Path(state_dir).exists()


def test_instances_that_no_longer_serve_leave_the_record_and_a_host_without_one_gets_one(node):
    state_dir = node.path("fleet-state")
    FleetState(state_dir).set_served("worker1", {"vllm-0", "vllm-1"})
    fake = FakeHost()
    assert commands(served.instances_out_of_service, fake, fleet_state_dir=state_dir,
                    still_serving=lambda recorded: recorded - {"vllm-1"}, why="restarting") == []
    assert FleetState(state_dir).served()["worker1"] == {"vllm-0"} and fake.noops == ["served: vllm-0"]
    asked = []
    commands(served.instances_out_of_service, FakeHost(name="worker2"), fleet_state_dir=state_dir,
             still_serving=lambda recorded: asked.append(recorded) or {"vllm-0"}, why="found down")
    assert asked == [None] and FleetState(state_dir).served()["worker2"] == {"vllm-0"}


# ---------------------------------------------------------------- units


def test_only_a_failed_unit_has_its_failure_cleared():
    unit = instance_unit("vllm-0")
    failed = {"ActiveState": "failed", "SubState": "failed"}
    assert commands(units.failure_cleared, FakeHost({UnitState: failed}), unit=unit) == [
        f"systemctl reset-failed {unit}"]
    for state in ("active", "inactive"):
        fake = FakeHost({UnitState: {"ActiveState": state, "SubState": "running" if state == "active" else "dead"}})
        assert commands(units.failure_cleared, fake, unit=unit) == [] and fake.noops == [f"{unit} has not failed"]


def test_a_unit_in_its_crash_loop_is_stopped_so_the_start_that_follows_is_a_fresh_one():
    """Found by the lab: after a driver reboot an enabled instance crash-looped (no CANN yet), and the
    serve stage's start waited for a restart that ran before CANN was back, failing the run."""
    unit = instance_unit("vllm-0")
    looping = FakeHost({UnitState: {"ActiveState": "activating", "SubState": "auto-restart"}})
    assert commands(units.failure_cleared, looping, unit=unit) == [
        f"systemctl stop {unit} && systemctl reset-failed {unit}"]


def started_calls(node: Node) -> list[str]:
    """What the node was asked to do, without the reads that go with a start."""
    return [call for call in node.calls() if not call.startswith(("systemctl show", "journalctl"))]


def test_a_routed_unit_restarts_on_its_new_unit_file_then_waits_out_the_gateways_memory(node):
    unit = instance_unit("vllm-0")
    steps = commands(units.restarted_while_routed, FakeHost(), unit=unit, gateway_memory_seconds=30)
    assert node.run(steps).returncode == 0
    assert started_calls(node) == ["systemctl daemon-reload", f"systemctl restart {unit}", "sleep 30"]


def test_a_routed_unit_that_fails_to_restart_fails_at_once_without_the_wait_and_says_why(node):
    unit = instance_unit("vllm-0")
    steps = commands(units.restarted_while_routed, FakeHost(), unit=unit, gateway_memory_seconds=30)
    result = node.run(steps, START_FAILS="pre", UNIT_LINE="weights are not staged: no /mnt/nvme/m/.ok")
    assert result.returncode != 0 and "sleep 30" not in node.calls()
    assert result.stderr == (f"{unit} did not start: weights are not staged: no /mnt/nvme/m/.ok; "
                             f"see journalctl -u {unit}\n")


def unit_host(sub_state: str, enabled: bool) -> FakeHost:
    unit = instance_unit("vllm-0")
    active = "active" if sub_state == "running" else "failed"
    return FakeHost({UnitState: {"ActiveState": active, "SubState": sub_state},
                     fact(SystemdEnabled, services=[unit]): {unit: enabled}})


def test_a_running_enabled_unit_is_left_alone_and_a_stopped_one_started_and_enabled(node):
    unit = instance_unit("vllm-0")
    fake = unit_host("running", enabled=True)
    assert commands(units.running, fake, unit=unit) == [] and fake.noops == [f"{unit} is running"]
    assert node.run(commands(units.running, unit_host("failed", enabled=False), unit=unit)).returncode == 0
    assert started_calls(node) == [f"systemctl start {unit}", f"systemctl enable {unit}"]


def test_a_changed_unit_is_restarted_on_its_new_unit_file(node):
    unit = instance_unit("vllm-0")
    steps = commands(units.running, unit_host("running", enabled=True), unit=unit, restarted=True)
    assert node.run(steps).returncode == 0
    assert started_calls(node) == ["systemctl daemon-reload", f"systemctl restart {unit}"]


def test_a_changed_unit_no_gateway_routes_to_is_marked_so_before_its_restart_and_not_when_it_only_starts(node):
    unit, marker = instance_unit("vllm-0"), Path(node.path("out-of-routing/vllm-0"))
    steps = commands(units.running, unit_host("running", enabled=True), unit=unit, restarted=True,
                     unrouted_marker=str(marker))
    assert node.run(steps).returncode == 0
    assert marker.exists() and started_calls(node)[-1] == f"systemctl restart {unit}"
    marker.unlink()
    steps = commands(units.running, unit_host("failed", enabled=True), unit=unit, restarted=True,
                     unrouted_marker=str(marker))
    assert node.run(steps).returncode == 0 and not marker.exists()  # no stop to spare a wait


def test_a_start_that_fails_says_why_in_one_line_from_what_it_logged(node):
    """Found by CI: a rerun after Ctrl-C failed at "Instance vllm-0 serving" with systemctl's "see
    systemctl status" alone, and the reason (in the node's journal) was gone with the lab."""
    unit = instance_unit("vllm-0")
    steps = commands(units.running, unit_host("failed", enabled=True), unit=unit)
    check = "port 8000 is already in use (LISTEN 0 5 *:8000); a second vLLM would silently share it"
    result = node.run(steps, START_FAILS="pre", UNIT_LINE=check, MAIN_LINE="INFO: Shutting down")
    assert result.returncode == 1
    assert result.stderr == f"{unit} did not start: {check}; see journalctl -u {unit}\n"
    # A new main process that exited: its own error, not the start check's "exited before /health".
    crashed = node.run(steps, START_FAILS="main", UNIT_LINE="vLLM (pid 200) exited before /health answered",
                       MAIN_LINE="RuntimeError: NPU 4 is already in use by process 77")
    assert crashed.stderr.startswith(f"{unit} did not start: RuntimeError: NPU 4 is already in use by process 77;")
    # Nothing in the journal: systemctl's own words.
    silent = node.run(steps, START_FAILS="pre")
    assert "did not start: Job for" in silent.stderr


# ---------------------------------------------------------------- vendor packages

PACKAGE = "Ascend-hdk-910b-npu-driver_25.2.0_linux-aarch64.run"
GOOD = "#!/bin/sh\necho driver\n"


def package_node(node: Node, on_node: str | None = None) -> FakeHost:
    dest = f"{node.root}/packages/{PACKAGE}"
    return FakeHost({fact(Sha256File, path=dest): on_node, **new_file(f"{dest}.partial")})


def fetched(node: Node, fake: FakeHost, **source) -> list:
    return commands(vendor.package_fetched, fake, file_name=PACKAGE, sha256=sha256(GOOD),
                    dest_dir=f"{node.root}/packages", **source)


def test_a_package_already_verified_on_the_node_is_not_fetched_again(node):
    fake = package_node(node, on_node=sha256(GOOD))
    assert fetched(node, fake, url="http://mirror/x.run") == [] and fake.noops


@pytest.mark.parametrize("source", ["url", "local_path"])
def test_a_package_takes_its_final_name_executable_only_once_its_sha256_matches(node, source):
    origin = node.root / "origin.run"
    origin.write_text(GOOD)
    where = origin.as_uri() if source == "url" else str(origin)
    result = node.run(fetched(node, package_node(node), **{source: where}))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (node.root / "packages").iterdir()] == [PACKAGE]
    assert os.access(node.root / "packages" / PACKAGE, os.X_OK)


def test_a_corrupt_download_is_deleted_and_named_in_one_line(node):
    origin = node.root / "origin.run"
    corrupt = GOOD + "tampered\n"
    origin.write_text(corrupt)
    result = node.run(fetched(node, package_node(node), url=origin.as_uri()))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{PACKAGE} from {origin.as_uri()} has sha256 {sha256(corrupt)}, the profile expects "
        f"{sha256(GOOD)}: the copy is corrupt or the profile is wrong; fix it and rerun"]
    assert list((node.root / "packages").iterdir()) == []


def test_a_mirror_that_does_not_answer_is_one_line_naming_the_host_and_the_url(node):
    url = (node.root / "absent.run").as_uri()
    (node.root / "packages").mkdir()
    (node.root / "packages" / f"{PACKAGE}.partial").write_text("#!/bin/sh\n")  # cut off in an earlier run
    result = node.run(fetched(node, package_node(node), url=url))
    assert result.returncode == 1  # curl's own line, then what to do
    assert result.stderr.splitlines()[-1].startswith(f"worker1: {PACKAGE}: cannot download {url} (curl exit 37); ")
    assert list((node.root / "packages").iterdir()) == []


def test_the_origin_is_asked_only_when_no_peer_had_a_verified_copy(node):
    fake = package_node(node)
    with on(fake):
        steps = vendor.package_fetched._inner(file_name=PACKAGE, sha256=sha256(GOOD), url="http://mirror/x.run",
                                              dest_dir=f"{node.root}/packages", peer_urls=["http://worker2:8090"])
        assert next(steps).startswith("mkdir -p ") and next(steps).startswith("for src in ")
        fake.facts[fact(Sha256File, path=f"{node.root}/packages/{PACKAGE}")] = sha256(GOOD)  # a peer had it
        assert list(steps) == []


def test_only_the_seeder_fetches_a_package_for_the_fleet():
    others = FakeHost(name="worker1")
    seeded = dict(file_name=PACKAGE, sha256=sha256(GOOD), url="http://mirror/x.run", peer_urls=["http://worker2:8090"])
    assert commands(vendor.package_seeded, others, seeder="worker3", **seeded) == []
    assert others.noops == [f"worker3 fetches {PACKAGE} for the fleet; this worker takes it from a peer next"]
    steps = commands(vendor.package_seeded, FakeHost({Sha256File: None}, name="worker3"), seeder="worker3", **seeded)
    assert steps[0] == f"mkdir -p {vendor.PACKAGE_DIR}" and "http://worker2:8090/packages/" in steps[1]


SERVICE_ACCOUNT = {"home": SERVICE_HOME, "shell": "/usr/sbin/nologin", "group": "vllm",
                   "groups": ["HwHiAiUser"], "home_owner": ("vllm", "vllm")}


def test_an_account_as_wanted_is_left_alone_and_one_that_differs_is_changed_by_pyinfras_user():
    wanted = {"user": "vllm", "home": SERVICE_HOME, "shell": "/usr/sbin/nologin", "groups": ["HwHiAiUser"],
              "system": True}
    fake = FakeHost({Account: SERVICE_ACCOUNT})
    assert commands(accounts.user, fake, **wanted) == []
    assert fake.noops == [f"user vllm exists, home {SERVICE_HOME} owned by it"]
    users = {"vllm": {"home": SERVICE_HOME, "shell": "/bin/sh", "group": "vllm", "groups": ["HwHiAiUser"]}}
    drifted = FakeHost({Account: {**SERVICE_ACCOUNT, "shell": "/bin/sh"}, Users: users, Groups: {"vllm", "HwHiAiUser"},
                        Os: "Linux", Which: "/usr/sbin/usermod",
                        Directory: {"mode": 755, "user": "vllm", "group": "vllm"}})
    assert [str(c) for c in commands(accounts.user, drifted, **wanted)] == ["usermod -s /usr/sbin/nologin vllm"]


def test_the_account_fact_reads_getent_id_and_the_homes_owner():
    lines = [f"vllm:x:999:999::{SERVICE_HOME}:/usr/sbin/nologin", "vllm", "vllm HwHiAiUser", "vllm vllm"]
    assert Account().process(lines) == SERVICE_ACCOUNT
    assert Account().process([]) is None
