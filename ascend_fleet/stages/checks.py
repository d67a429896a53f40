"""The preflight and verify stages (the first and the last of stages/full.py): gates that change nothing.

Preflight's data checks run while pyinfra prepares the deploy, so bad input stops the
whole run before any host is touched; its node checks are the first operations, so a
node that cannot take the stack stops before anything on it changes.
"""

from __future__ import annotations

import shlex
import time
from functools import cache
from pathlib import Path

import requests
from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.facts.hardware import Ipv4Addrs, NetworkDevices
from pyinfra.facts.server import Command

from ascend_fleet import FILES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.node_os import NodeOs, node_os, not_served, role_gaps
from ascend_fleet.config.per_run import once_per_run
from ascend_fleet.config.profile import Profile
from ascend_fleet.core.bundle_layout import model_dir
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.model_tree import read_manifest
from ascend_fleet.core.node_layout import (
    GATEWAY_API_KEY_FILE,
    INSTANCE_UNIT_PREFIX,
    MANIFEST_NAME,
    NGINX_ERROR_LOG,
    revision_dir,
)
from ascend_fleet.facts.ascend import Glibc, NpuDeviceHolders, NpuStatus, PciNpuCount, VenvPython
from ascend_fleet.facts.systemd import UnitState
from ascend_fleet.facts.weights import FilesystemSpace, StagedModel
from ascend_fleet.fleet.bundle import coverage_refusal, os_coverage_refusal, rpms_lacking, verify_bundle
from ascend_fleet.fleet.check import vendor_file_problem
from ascend_fleet.fleet.os_repository import MIRROR_GROUP, fleet_packages
from ascend_fleet.fleet.plan import check_fleet, model_support
from ascend_fleet.fleet.probes import answers_in_deploy, gateway_chat, http_query, judge_gateway
from ascend_fleet.fleet.profile_check import Indexes
from ascend_fleet.fleet.profile_lock import glibc_problem, node_lock
from ascend_fleet.fleet.stack_platform import platform_problem
from ascend_fleet.operations import gates, served, weights
from ascend_fleet.operations.weights import DEFAULT_MIN_FREE_MARGIN_BYTES
from ascend_fleet.stages.context import (
    host_arch,
    host_os,
    host_release,
    node_profile,
    pip_index_url,
    python_packages,
    running_kernel_headers,
)
from ascend_fleet.stages.platform import npu_problem
from ascend_fleet.stages.python_stack import torch_npu_problem
from ascend_fleet.stages.serving import instance_problem, still_serving

GATEWAY_SETTLE_SECONDS = 30


def check_vendor_files(profile: Profile, arch: str) -> None:
    """Every package the profile needs has a sha256; files/ copies match it (checked on this machine)."""
    for name in profile.vendor_files(arch).values():
        profile.sha256_of(name)  # refuses a package without one
        if profile.packages.source != "files":
            continue
        local = (FILES / name).absolute()
        if not local.exists():
            raise FleetError(f"{host.name}: {local} is missing; download it from Huawei and put it in files/")
        if problem := vendor_file_problem(profile, name):
            raise FleetError(f"{host.name}: {problem}")


def release_refusal(profile: Profile, config: NodeConfig) -> str | None:
    """Why some stage this node runs cannot serve its distribution release (node_os.py), or None: a
    release not served, a package its roles need that the release is not known to have, a Python the
    profile needs that neither the release nor the profile gives, firewalld left to reject the fleet."""
    distribution, release = host_release()
    known = node_os(distribution, release)
    if known is None:
        return not_served(distribution, release)
    virtual_address = config.gateway_vip is not None
    gaps = role_gaps(known, config.is_worker, config.is_gateway, virtual_address)
    if gaps:
        roles = " and ".join(role for role, takes in (
            ("worker", config.is_worker), ("gateway", config.is_gateway and not virtual_address),
            ("gateway with gateway_vip", config.is_gateway and virtual_address)) if takes)
        return (f"{known.name} has no known {', '.join(gaps)}, which the {roles} role needs (docs/sim-fidelity.md, "
                "openEuler node data); give the role to a node of another release")
    if not config.is_worker:
        return None
    python = profile.stack.python
    if python_packages(profile, known) is None:
        return (f"{known.name}'s Python is {known.system_python}, profile {profile.name} needs {python}: name the "
                f"packages that give it there in the profile's pip.python_packages['{known.name}'], or reinstall the "
                f"node with a release whose Python is {python}")
    firewall = known.default_firewall
    if (firewall and not config.instance_firewall
            and host.get_fact(UnitState, unit=f"{firewall}.service")["ActiveState"] == "active"):
        return (f"{firewall} runs and rejects the fleet's ports, and instance_firewall is false: set it true (the "
                f"tool then loads its own table and masks {firewall}), or stop and disable {firewall} yourself")
    return None


def check_release(profile: Profile, config: NodeConfig) -> None:
    """A node some stage cannot serve stops the run while pyinfra prepares it, before any host changes."""
    refusal = release_refusal(profile, config)
    if refusal:
        raise FleetError(f"{host.name}: {refusal}")


def system_problem(profile: Profile) -> str | None:
    arch = host_arch()
    if arch not in profile.arch:
        return f"architecture {arch} is not in profile {profile.name}'s {profile.arch}"
    if host.get_fact(Command, command="id -u") != "0":
        return "the deploy needs root: connect as root or pass --sudo"
    return None


def check_known_issues(profile: Profile, arch: str) -> None:
    """A worker of an arch the profile's upstream release says fails with its CANN stops the run while pyinfra
    prepares it, before any host is touched."""
    refusal = profile.refusal(arch)
    if refusal:
        raise FleetError(f"{host.name}: {refusal}")


@cache
def mirror_model_bytes(url: str, model_id: str, revision: str) -> int:
    """A revision's total size, from the HTTP mirror's manifest (read here, on the control machine)."""
    manifest_url = f"{url.rstrip('/')}/models/{model_id}/{revision}/{MANIFEST_NAME}"
    try:
        response = requests.get(manifest_url, timeout=30)
        response.raise_for_status()
        return sum(entry["size"] for entry in response.json()["files"].values())
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise FleetError(f"weights {model_id}@{revision}: cannot read {manifest_url} ({exc}); "
                         "check the mirror and model.url") from None


def model_bytes(config: NodeConfig) -> int:
    """The model revision's total size: from the site's bundle (its mirror serves only once the mirror stage
    ran), else from the HTTP mirror's manifest."""
    model = config.model
    if config.bundle_dir:
        carried = read_manifest(model_dir(Path(config.bundle_dir), model.id, model.revision))
        return sum(entry["size"] for entry in carried["files"].values())
    return mirror_model_bytes(model.url, model.id, model.revision)


def nvme_problem(config: NodeConfig) -> str | None:
    """The NVMe is mounted and, unless this revision is staged already, has room for it plus a margin.
    The size is known here for an HTTP mirror or a bundle; a hub's manifest is read by the node, which
    checks again."""
    mount, model = config.nvme_mount, config.model
    target = host.get_fact(Command, command=f"findmnt -n -o TARGET --target {shlex.quote(mount)} 2>/dev/null "
                                            "|| echo none")
    if target != mount:
        return f"nvme_mount {mount} is not a mounted filesystem (it is on {target}); mount the local NVMe there"
    if model.source != "http" or host.get_fact(StagedModel, model_dir=config.model_dir, model_id=model.id,
                                                revision=model.revision):
        return None
    try:
        needed = model_bytes(config) + DEFAULT_MIN_FREE_MARGIN_BYTES
    except FleetError as exc:
        return str(exc)
    free = host.get_fact(FilesystemSpace, path=mount)["free_bytes"]
    if free < needed:
        return (f"{model.id}@{model.revision} needs {needed} bytes on {mount} (weights plus "
                f"{DEFAULT_MIN_FREE_MARGIN_BYTES} margin) but {free} are free; free space or use a larger NVMe")
    return None


def kernel_headers_problem(config: NodeConfig, known: NodeOs) -> str | None:
    """The running kernel's headers, which the driver builds its module against (Huawei's guide installs
    kernel-devel-$(uname -r), never the newest), are installed, or in the node's repositories, or, with a
    bundle, in its OS packages."""
    headers = running_kernel_headers()
    kernel = headers["kernel"]
    if config.bundle_dir:
        lacking = rpms_lacking(Path(config.bundle_dir), known, host_arch(), headers["not_installed"])
        if lacking:
            return (f"the running kernel {kernel}'s {' and '.join(lacking)} are not in bundle {config.bundle_dir}, and "
                    f"the driver builds against them; make the bundle again with `ascend-fleet bundle INVENTORY "
                    f"--out {config.bundle_dir} --os '{known.name}' --kernel {kernel}` where the archive answers")
        return None
    lacking = [package for package in headers["not_installed"] if package not in headers["listed"]]
    if lacking:
        return (f"the running kernel {kernel}'s {' and '.join(lacking)} are in none of its repositories, and the "
                "driver builds against them; boot a kernel whose headers a repository has (`dnf upgrade kernel`, "
                "reboot), or add a repository that has them")
    return None


def npus_before_deploy(config: NodeConfig) -> str | None:
    """NPU count and health now: by npu-smi if a driver is loaded, else by the PCI bus."""
    status = host.get_fact(NpuStatus)
    if status["ok"]:
        return npu_problem(config.npu_count)
    on_bus = host.get_fact(PciNpuCount)
    if on_bus and on_bus != config.npu_count:
        return f"lspci shows {on_bus} NPUs, the inventory says npu_count={config.npu_count}; fix the inventory"
    return None  # no driver yet and nothing on the bus to count: the driver stage's gate counts them


def npus_checked_before_deploy(config: NodeConfig) -> str:
    """What preflight could check of the NPUs: a fresh node has no driver, so npu-smi cannot read them yet."""
    if host.get_fact(NpuStatus)["ok"]:
        return f"{config.npu_count} NPUs listed, all healthy"
    return (f"no NPU driver yet: {config.npu_count} NPUs are counted and their health read after the driver, "
            "firmware and reboot (the driver stage's gate stops the node there if one is unhealthy)")


def serving_nic_problem(config: NodeConfig) -> str | None:
    """A multi-node member's gloo, TP and HCCL sockets bind the NIC its data names: it must exist and
    carry serving_address, or the instance fails only when its members meet (in gloo or HCCL)."""
    nic, address = config.member_nic, str(config.serving_address)
    key = "serving_nic" if config.serving_nic else "data_parallel.nic"
    devices = host.get_fact(NetworkDevices)
    if nic not in devices:
        return (f"{key} {nic}: no such NIC here (it has {', '.join(sorted(devices))}); name the one that carries "
                f"serving_address {address}")
    carried = host.get_fact(Ipv4Addrs).get(nic, [])
    if address not in carried:
        has = ", ".join(carried) or "no IPv4 address"
        return (f"{key} {nic} does not carry serving_address {address} (it has {has}); set serving_nic to the NIC "
                "that does, or correct serving_address")
    return None


def foreign_device_holders() -> str | None:
    holders = [h for h in host.get_fact(NpuDeviceHolders) if not h["unit"].startswith(INSTANCE_UNIT_PREFIX)]
    if holders:
        listed = ", ".join(f"pid {h['pid']} ({h['command']})" for h in holders)
        return f"{listed} holds /dev/davinci* and is not an ascend-fleet instance; stop it before deploying"
    return None


def check_bundle(config: NodeConfig, profile: Profile) -> None:
    """The site's bundle is as its manifest lists it (checked once per run) and serves this node's release
    and arch (its OS packages) and, on a worker, its Python: refused here, before any host changes."""
    bundle = Path(config.bundle_dir)
    problems = once_per_run(host.state, f"bundle {bundle}", lambda: verify_bundle(bundle))
    if problems:
        more = f" (and {len(problems) - 1} more: `ascend-fleet bundle verify {bundle}`)" if len(problems) > 1 else ""
        raise FleetError(f"{host.name}: {problems[0]}{more}; make the bundle again where the indexes answer")
    arch, known = host_arch(), host_os()
    refusal = os_coverage_refusal(bundle, known, arch, fleet_packages(host.state, known, [config],
                                                                      MIRROR_GROUP in host.groups))
    if config.is_worker:
        refusal = coverage_refusal(bundle, profile.name, arch, profile.stack.python) or refusal
    if refusal:
        raise FleetError(f"{host.name}: {refusal}")


def check_fleet_plan_once() -> None:
    """The capacity plan of the whole inventory, once per pyinfra run: an instance that cannot
    fit stops the run while pyinfra prepares it, before any host is touched."""
    once_per_run(host.state, "fleet plan", lambda: check_fleet(inventory))


@deploy("Preflight")
def preflight_stage() -> None:
    gates.stage_begins(name="Stage: preflight", stage="preflight")
    profile = node_profile()
    config = host_node_config(host)
    check_fleet_plan_once()
    check_release(profile, config)
    if config.bundle_dir:
        check_bundle(config, profile)  # its files/ holds the vendor packages, as the profile pins them
    if config.is_worker:
        arch = host_arch()
        check_known_issues(profile, arch)
        if not config.bundle_dir:
            check_vendor_files(profile, arch)
        # First: a node refused below, or one whose instance died since the last run, routes nothing new.
        served.instances_out_of_service(name="Instances down since the last run out of the gateway's record",
                                        why="found down", fleet_state_dir=config.fleet_state_dir,
                                        still_serving=lambda recorded: still_serving(config, recorded))
    gates.passed(name="Supported architecture and root", description="architecture and root OK",
                 find_problem=lambda: system_problem(profile))
    if not config.is_worker:
        return
    if not config.bundle_dir:  # a bundle's coverage was checked above; its index may not serve yet (mirror stage)
        gates.passed(name="The stack's wheels install here", description=f"profile {profile.name}'s pinned "
                     "wheels cover this arch, glibc and Python",
                     find_problem=lambda: platform_problem(profile, host_arch(), host.get_fact(Glibc),
                                                           pip_index_url(profile),
                                                           once_per_run(host.state, "pip indexes", Indexes)))
    lock = node_lock(profile, host_arch(), profile.stack.python, config.pip_locks_path)
    if lock:
        gates.passed(name="The lock's wheels load here", description=f"{lock.name} was locked for this glibc or "
                     "an older one", find_problem=lambda: glibc_problem(lock, host.get_fact(Glibc)))
    known = host_os()
    if known.kernel_headers_required:
        gates.passed(name="The running kernel's headers installable", description="the running kernel's "
                     f"{' and '.join(known.kernel_headers).format(kernel='$(uname -r)')} installed or in a repository",
                     find_problem=lambda: kernel_headers_problem(config, known))
    gates.passed(name="Local NVMe mounted, room for the weights",
                 description=f"{config.nvme_mount} mounted, room for {config.model.id}@{config.model.revision}",
                 find_problem=lambda: nvme_problem(config))
    gates.passed(name="NPU count and health", description=lambda: npus_checked_before_deploy(config),
                 find_problem=lambda: npus_before_deploy(config))
    gates.passed(name="No foreign process on the NPUs", description="/dev/davinci* free or ours",
                 find_problem=foreign_device_holders)
    if config.data_parallel:
        gates.passed(name="The serving NIC carries the serving address",
                     description=f"{config.member_nic} carries {config.serving_address}",
                     find_problem=lambda: serving_nic_problem(config))


# Run in the serving virtualenv: the model's type as config.json names it, whether its transformers'
# AutoConfig knows that type, and, where the manifest records a tokenizer probe, whether the node's
# tokenizer reproduces its ids. Config and tokenizer need no torch: USE_TORCH=0 keeps transformers
# from importing torch and, through it, torch_npu, which wants the CANN environment (the lab's torch
# stand-in has no tensors at all).
MODEL_PROBE = """
import json, os
os.environ["USE_TORCH"] = "0"
import transformers
path = {path!r}
model_type = json.load(open(os.path.join(path, "config.json")))["model_type"]
try:
    transformers.AutoConfig.from_pretrained(path)
    config = "config-known"
except (KeyError, ValueError):
    config = "config-unknown"
manifest = os.path.join(path, {manifest!r})
probe = json.load(open(manifest)).get("tokenizer_probe") if os.path.exists(manifest) else None
ids = probe and transformers.AutoTokenizer.from_pretrained(path).encode(probe["text"], add_special_tokens=False)
print(model_type, config, "probe-mismatch" if probe and ids != probe["ids"] else "probe-ok")
"""


def model_problem(config: NodeConfig, profile: Profile) -> str | None:
    """The model's config is readable by the pinned vLLM (its transformers knows the type, or vLLM
    brings the config class itself, as 0.17.0 does for Qwen3.5), and the node's tokenizer
    reproduces the manifest's probe ids."""
    model_path = revision_dir(config.model_dir, config.model.id, config.model.revision)
    probe = MODEL_PROBE.format(path=str(model_path), manifest=MANIFEST_NAME)
    # Its answer depends on the venv's transformers and the model's files alone: kept until they change.
    result = host.get_fact(VenvPython, venv=profile.pip.venv, code=probe,
                           depends_on=[f"{shlex.quote(str(model_path))}/*"])
    if not result["ok"]:
        return f"transformers cannot load {model_path}: {result['output']}; check the profile's transformers version"
    model_type, known, probe = result["output"].split()
    support = model_support().get(model_type)
    if known == "config-unknown" and not (support and support.config_from_vllm(profile.stack.vllm)):
        return (f"transformers {profile.stack.transformers} does not know model_type {model_type!r} of {model_path}, "
                f"and vLLM {profile.stack.vllm} brings no config for it; check the profile's transformers version")
    if probe == "probe-mismatch":
        return f"the tokenizer at {model_path} does not reproduce the manifest's probe ids; restage the weights"
    return None


def gateway_problem(config: NodeConfig, model_name: str) -> str | None:
    """A chat completion through the gateway (probes.judge_gateway). An nginx reload finishes
    asynchronously (old workers drain with the old config), so it gets a few seconds to take effect."""
    query = http_query(config.gateway.listen_port, GATEWAY_API_KEY_FILE, "/v1/chat/completions",
                       gateway_chat(model_name))
    deadline = time.monotonic() + GATEWAY_SETTLE_SECONDS
    while (problem := judge_gateway(answers_in_deploy({"chat": query})["chat"])) and time.monotonic() < deadline:
        time.sleep(2)
    return f"through the gateway, {problem}; see {NGINX_ERROR_LOG}" if problem else None


def fleet_model_name() -> str:
    """The served model name clients use, from any worker of the inventory."""
    for worker in inventory:  # every host, also those a --limit leaves out
        config = host_node_config(worker)
        if config.is_worker:
            return config.model.served_model_name
    raise FleetError("verify: the inventory has no worker with a model")


@deploy("Verify")
def verify_stage() -> None:
    gates.stage_begins(name="Stage: verify", stage="verify")
    config = host_node_config(host)
    if config.is_gateway:
        model_name = fleet_model_name()
        gates.passed(name="Chat completion through the gateway", description="the gateway answers a chat completion",
                     find_problem=lambda: gateway_problem(config, model_name))
    if not config.is_worker:
        return
    if config.weights_deep_verify:
        model = config.model
        weights.deep_verified(name=f"Weights {model.id}@{model.revision} hashed against the manifest (deep verify)",
                              model_id=model.id, revision=model.revision, model_dir=config.model_dir)
    venv = node_profile().pip.venv
    gates.passed(name="NPUs healthy", description=f"{config.npu_count} NPUs healthy",
                 find_problem=lambda: npu_problem(config.npu_count))
    gates.passed(name="torch_npu imports", description="torch_npu sees every NPU",
                 find_problem=lambda: torch_npu_problem(venv, config.npu_count))
    gates.passed(name="Model type and tokenizer",
                 description="the pinned vLLM reads the model's config; tokenizer probe matches",
                 find_problem=lambda: model_problem(config, node_profile()))
    for instance in config.instances:
        gates.passed(name=f"Instance {instance.name} healthy", description=f"{instance.name} /health 200, model served",
                     find_problem=lambda i=instance: instance_problem(config, i))
