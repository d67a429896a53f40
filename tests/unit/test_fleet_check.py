"""The check before any connection: `ascend-fleet check` and every deploy's inventory line list every
problem the data alone shows, one line each, and stop before pyinfra connects (exit 2).

The example fleet's hosts (*.example.internal) resolve nowhere: a run that tried to connect would
print pyinfra's "Connecting to hosts" and its connection errors."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pyinfra.api import State

from ascend_fleet import PROFILES, PROJECT_ROOT
from ascend_fleet.config.profile import load_profile
from ascend_fleet.fleet import firewall, virtual_address
from ascend_fleet.fleet.check import fleet_problems, inventory_problems, merge_hosts, vendor_file_problems
from ascend_fleet.fleet.plan import load_inventory, plan_fleet

BIN = Path(sys.executable).parent


@pytest.fixture
def site(tmp_path) -> Path:
    """A copy of the example fleet (inventories/prod.py and group_data/) to change one value at a time."""
    (tmp_path / "inventories").mkdir()
    for name in ("prod.py", "prod.known_hosts", "prod_397b.py"):
        shutil.copy(PROJECT_ROOT / "inventories" / name, tmp_path / "inventories" / name)
    shutil.copytree(PROJECT_ROOT / "group_data", tmp_path / "group_data")
    return tmp_path


# What a site's resolver would say of the example fleets' names (which resolve nowhere here).
EXAMPLE_ADDRESSES = {"gw-01.example.internal": "10.0.0.2", "gw-02.example.internal": "10.0.0.3",
                     "grafana.example.internal": "10.9.0.7",
                     **{f"npu-0{n}.example.internal": f"10.0.1.{n}" for n in range(1, 6)}}


@pytest.fixture
def resolving(monkeypatch):
    """The example fleets' names resolve, as a site's own do (the firewall and keepalived need them)."""
    def resolve(name):
        if name not in EXAMPLE_ADDRESSES:
            raise socket.gaierror(-2, "Name or service not known")
        return [EXAMPLE_ADDRESSES[name]]
    monkeypatch.setattr(firewall, "resolve", resolve)
    monkeypatch.setattr(virtual_address, "resolve", resolve)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} no longer holds {old!r}"
    path.write_text(text.replace(old, new, 1))


def run(site: Path, *argv: str) -> tuple[int, str]:
    result = subprocess.run(argv, cwd=site, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "400"})
    return result.returncode, re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def test_a_typo_in_group_data_stops_the_deploy_before_it_connects_and_check_gives_the_same_line(site):
    edit(site / "group_data/prod.py", '"max_num_seqs": 32', '"max_num_seq": 32')
    rc, output = run(site, str(BIN / "pyinfra"), "-y", "inventories/prod.py", str(PROJECT_ROOT / "deploys/full.py"))
    assert rc == 2, output
    line = ("npu-01.example.internal, npu-02.example.internal, npu-03.example.internal and 4 more: "
            "serving.max_num_seq: unknown key (did you mean `max_num_seqs`?)")
    assert f"--> pyinfra error: {line}" in output
    assert "Connecting to hosts" not in output
    rc, output = run(site, str(BIN / "ascend-fleet"), "check", "inventories/prod.py")
    assert (rc, output) == (2, f"error: {line}\n")


def test_check_lists_every_problem_of_every_host_not_only_the_first(site):
    edit(site / "inventories/prod.py", '"nvme_mount": "/mnt/nvme"}', '"nvme_mount": "mnt/nvme"}')
    edit(site / "group_data/gateway.py", '"listen_port": 80', '"listen_port": "eighty"')
    rc, output = run(site, str(BIN / "ascend-fleet"), "check", "--json", "inventories/prod.py")
    assert rc == 2
    problems = __import__("json").loads(output)["problems"]
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "nvme_mount: expected an absolute path on the node (got 'mnt/nvme')",
        "gateway.listen_port: Input should be a valid integer, unable to parse string as an integer (got 'eighty')"]
    assert problems[0].startswith("npu-01.example.internal, npu-02.example.internal, npu-03.example.internal "
                                  "and 2 more")
    assert problems[1].startswith("gw-01.example.internal, gw-02.example.internal: ")


def test_a_host_given_data_twice_in_the_inventory_file_is_refused(site):
    edit(site / "inventories/prod.py", 'gateway = [("gw-01.example.internal", _ssh),',
         'gateway = [("npu-05.example.internal", _worker), ("gw-01.example.internal", _ssh),')
    problems = fleet_problems(load_inventory(site / "inventories/prod.py", site), site / "inventories/prod.py")
    assert problems[0] == (f"{site}/inventories/prod.py: host npu-05.example.internal is given data in workers and "
                           "in gateway; pyinfra would keep only the last; give its data once and list it by name "
                           "elsewhere")


def test_fleet_wide_problems_are_listed_together(site):
    # Two hosts on one serving address, and a multi-node group listed head-last: pyinfra orders a group's
    # hosts by the inventory's order, so npu-01 heads q397_a and is the host the rollout waves must hold.
    inventory = site / "inventories/prod_397b.py"
    edit(inventory, '"serving_address": f"192.168.13.{30 + n}"', '"serving_address": f"192.168.13.{30 + n // 2}"')
    edit(inventory, 'canary = ["npu-01.example.internal"]', 'canary = ["npu-02.example.internal"]')
    problems = fleet_problems(load_inventory(inventory, site), inventory)
    assert problems == [
        "npu-01.example.internal: rollout_waves: the head of multi-node instance q397_a (its first host in inventory "
        "order; its members move with it) is in none of canary, wave1; add it to one of those groups",
        "npu-03.example.internal: serving_address: 192.168.13.31 is npu-02.example.internal's too; expected each "
        "host's own address on the serving network"]


def test_a_host_in_two_multi_node_groups_is_named_as_such(site):
    inventory = site / "inventories/prod_397b.py"
    edit(inventory, 'q397_b = ["npu-03.example.internal", "npu-04.example.internal"]',
         'q397_b = ["npu-03.example.internal", "npu-04.example.internal", "npu-02.example.internal"]')
    problems = fleet_problems(load_inventory(inventory, site), inventory)
    assert problems[0].startswith("npu-02.example.internal: is in data_parallel group q3")
    assert "a host serves in one multi-node instance" in problems[0]


def test_pyinfra_commands_that_run_no_deploy_file_are_not_checked(site):
    edit(site / "group_data/prod.py", '"max_num_seqs": 32', '"max_num_seq": 32')
    rc, output = run(site, str(BIN / "pyinfra"), "inventories/prod.py", "debug-inventory")
    assert rc == 0, output


def test_problems_of_many_hosts_share_a_line():
    lines = ([f"npu-{n}: key: bad" for n in range(5)] + ["npu-1: other: bad", "files/x.run: missing"]
             + [f"npu-{n} instance vllm-0: too big" for n in range(2)])
    assert merge_hosts(lines, [f"npu-{n}" for n in range(5)]) == [
        "npu-0, npu-1, npu-2 and 2 more: key: bad", "npu-1: other: bad", "files/x.run: missing",
        "npu-0 instance vllm-0, npu-1 instance vllm-0: too big"]


def test_vendor_packages_without_sha256_or_with_another_are_refused_before_any_connection(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    worker = SimpleNamespace(profile="vllm-ascend-0.18.0", is_worker=True)
    assert vendor_file_problems(State(), [worker]) == [
        "profile vllm-ascend-0.18.0: no sha256 for 9 vendor packages (Ascend-cann-910b-ops_8.5.1_linux-aarch64.run, "
        "...); add those of your nodes' architecture under packages.files, from Huawei's download page (copy the "
        "profile to profiles/ here first)"]
    (tmp_path / "profiles").mkdir()
    profile = load_profile("vllm-ascend-0.18.0")
    data = yaml.safe_load((PROFILES / "vllm-ascend-0.18.0.yaml").read_text())
    data["packages"]["files"] = {name: {"sha256": hashlib.sha256(name.encode()).hexdigest()}
                                 for name in profile.vendor_files("aarch64").values()}
    (tmp_path / "profiles" / "vllm-ascend-0.18.0.yaml").write_text(yaml.safe_dump(data))
    firmware = profile.vendor_files("aarch64")["firmware"]
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / firmware).write_bytes(b"not the firmware")
    assert vendor_file_problems(State(), [worker]) == [  # aarch64's are all given: x86_64's may be left out
        f"{tmp_path}/files/{firmware} has sha256 {hashlib.sha256(b'not the firmware').hexdigest()}, profile "
        f"vllm-ascend-0.18.0 expects {hashlib.sha256(firmware.encode()).hexdigest()}; replace the file or correct "
        "the profile"]


UNFILLED_SHA256 = ("profile vllm-ascend-0.18.0: no sha256 for 9 vendor packages (Ascend-cann-910b-ops_8.5.1_linux-"
                   "aarch64.run, ...); add those of your nodes' architecture under packages.files, from Huawei's "
                   "download page (copy the profile to profiles/ here first)")


@pytest.fixture
def big_site(site, monkeypatch, resolving) -> Path:
    """The example fleet with 40 workers, its model's config.json in files/models as a fleet keeps it, run from."""
    for n in range(6, 41):
        monkeypatch.setitem(EXAMPLE_ADDRESSES, f"npu-{n:02d}.example.internal", f"10.0.1.{n}")
    edit(site / "inventories/prod.py", "for n in range(1, 6)]", "for n in range(1, 41)]")
    edit(site / "inventories/prod.py", 'wave2 = ["npu-04.example.internal", "npu-05.example.internal"]',
         'wave2 = [f"npu-{n:02d}.example.internal" for n in range(4, 41)]')
    models = site / "files/models/Eco-Tech/Qwen3.5-27B-w8a8-mtp/master"
    models.mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "tests/fixtures/models/qwen3.5-27b/config.json", models)
    monkeypatch.chdir(site)
    return site


def profile_reads(monkeypatch) -> list[Path]:
    """Every profile file read from now on, in order (load_profile reads the file's text)."""
    reads = []
    read_text = Path.read_text

    def counted(path: Path, *args, **kwargs) -> str:
        if path.suffix == ".yaml" and path.parent.name == "profiles":
            reads.append(path.resolve())
        return read_text(path, *args, **kwargs)
    monkeypatch.setattr(Path, "read_text", counted)
    return reads


def test_check_and_plan_of_a_fleet_read_its_profile_once_not_once_per_host(big_site, monkeypatch):
    """Issue 47: every instance parsed the profile again, 76 ms each: check and plan took 30 s at 1000 hosts."""
    inventory = big_site / "inventories/prod.py"
    reads = profile_reads(monkeypatch)
    assert inventory_problems(inventory, big_site) == [UNFILLED_SHA256]
    assert reads == [PROFILES / "vllm-ascend-0.18.0.yaml"]
    reads.clear()
    plan = plan_fleet(load_inventory(inventory, big_site))
    assert len({report.host for report in plan.instances}) == 40 and not plan.first_error()
    assert reads == [PROFILES / "vllm-ascend-0.18.0.yaml"]


def test_a_profile_in_profiles_where_check_runs_comes_before_the_packages_and_is_read_once(big_site, monkeypatch):
    inventory = big_site / "inventories/prod.py"
    assert inventory_problems(inventory, big_site) == [UNFILLED_SHA256]  # the package's, read in this process
    data = yaml.safe_load((PROFILES / "vllm-ascend-0.18.0.yaml").read_text())
    data["packages"]["files"] = {name: {"sha256": hashlib.sha256(name.encode()).hexdigest()}
                                 for name in load_profile("vllm-ascend-0.18.0").vendor_files("aarch64").values()}
    (big_site / "profiles").mkdir()
    (big_site / "profiles/vllm-ascend-0.18.0.yaml").write_text(yaml.safe_dump(data))
    reads = profile_reads(monkeypatch)
    assert inventory_problems(inventory, big_site) == []
    assert reads == [big_site / "profiles/vllm-ascend-0.18.0.yaml"]


@pytest.mark.parametrize("appended, line", [
    ("serving = {\n", "group_data/prod.py:{n}: '{{' was never closed; fix the file (it is Python)"),
    ("x = 1 / 0\n", "group_data/prod.py:{n}: ZeroDivisionError: division by zero; fix the file (it is Python)"),
], ids=["syntax error", "error when run"])
def test_group_data_python_that_does_not_run_is_one_line_not_a_traceback(site, appended, line):
    data = site / "group_data/prod.py"
    n = len(data.read_text().splitlines()) + 1
    data.write_text(data.read_text() + appended)
    rc, output = run(site, str(BIN / "ascend-fleet"), "check", "inventories/prod.py")
    assert (rc, output) == (2, f"error: {site}/{line.format(n=n)}\n")
    rc, output = run(site, str(BIN / "pyinfra"), "-y", "inventories/prod.py", str(PROJECT_ROOT / "deploys/full.py"))
    assert rc == 2 and f"--> pyinfra error: {site}/{line.format(n=n)}" in output and "Traceback" not in output


def test_a_model_config_that_is_not_a_json_object_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    rc, output = run(tmp_path, str(BIN / "ascend-fleet"), "plan", "--model-config", str(tmp_path / "config.json"))
    assert (rc, output) == (1, f"error: {tmp_path}/config.json: a JSON list, not the object a model's config.json "
                               "is; pass the model's config.json or its directory\n")


# Issue 49: inside dict-valued serving options and npu_env, as the pinned vLLM and the env file read them;
# a Python set there was a traceback.
TYPED_OPTIONS_REFUSED = {
    "a Python set in speculative_config": (
        '"enforce_eager": True}', '"enforce_eager": True, "x": {1, 2}}',
        "serving.speculative_config: x: {1, 2} is a Python set, which JSON cannot hold; write a list [...]"),
    "a cudagraph mode vLLM does not have": (
        '"FULL_DECODE_ONLY"', '"FULL_DECODE"',
        "serving.compilation_config.cudagraph_mode: 'FULL_DECODE' (a string): vLLM 0.18.0's "
        "CompilationConfig.cudagraph_mode (CUDAGraphMode) takes one of NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, "
        "FULL_AND_PIECEWISE"),
    "a zero HCCL_BUFFSIZE": ('"HCCL_BUFFSIZE": 512', '"HCCL_BUFFSIZE": 0', "npu_env: HCCL_BUFFSIZE='0': "),
}


@pytest.mark.parametrize("old, new, refusal", TYPED_OPTIONS_REFUSED.values(), ids=TYPED_OPTIONS_REFUSED.keys())
def test_typed_serving_options_and_npu_env_are_one_line_before_any_connection(site, old, new, refusal):
    edit(site / "group_data/prod.py", old, new)
    rc, output = run(site, str(BIN / "ascend-fleet"), "check", "inventories/prod.py")
    assert rc == 2 and "Traceback" not in output and output.count("\n") == 1, output
    assert output.startswith("error: npu-01.example.internal, ") and f" more: {refusal}" in output, output


def test_the_import_line_operators_copied_into_their_inventories_still_gives_the_check():
    # The check lives in fleet/check.py since the layers became folders (issue 50); inventories copied
    # from prod.py before that import it from ascend_fleet.fleet_check.
    from ascend_fleet.fleet import check
    from ascend_fleet.fleet_check import check_before_connecting
    assert check_before_connecting is check.check_before_connecting
    line = "from ascend_fleet.fleet_check import check_before_connecting"
    assert line in (PROJECT_ROOT / "inventories" / "prod.py").read_text()
