"""Bringing the lab up, down, and reading its state."""

from __future__ import annotations

import os
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

from rich.console import Console

from ascend_fleet import TEMPLATES
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.templating import render
from ascend_fleet.lab import cgroups, network, processes, rpmrepo
from ascend_fleet.lab.base import base_image
from ascend_fleet.lab.flavours import FLAVOURS
from ascend_fleet.lab.host import run
from ascend_fleet.lab.mirror import locks_dir, mirror_root, start_mirror
from ascend_fleet.lab.nodes import (
    empty_nvme,
    node_dir,
    prepare_node,
    prepare_root,
    remove_loop_mount,
    remove_mount,
    spawn_supervisor,
    start_lxcfs,
    start_node,
    wait_for_ssh,
    wipe_root,
)
from ascend_fleet.lab.publish import lock_profiles, publish_profiles
from ascend_fleet.lab.spec import LabSpec, NodeSpec
from ascend_fleet.lab.state import LabState

REQUIRED_TOOLS = ["debootstrap", "systemd-nspawn", "ip", "nft", "nginx", "lxcfs", "losetup", "mkfs.ext4", "ssh-keygen",
                  "ssh"]
# What building the openEuler stand-in repository takes (rpmrepo.py), when a node runs an RPM family.
RPM_TOOLS = ["rpm", "rpmbuild", "createrepo_c", "apt-get", "dpkg-deb"]
DISK_MARGIN_BYTES = 2 * 1024**3


def require_root(command: str) -> None:
    if os.geteuid() != 0:
        raise FleetError(f"{command}: must run as root (the lab creates namespaces, mounts and a bridge); log in "
                         "as root, or `su -` (`sudo -i` where sudo is installed)")


def check_can_run(spec: LabSpec) -> None:
    """Everything that would make `lab up` fail halfway, checked before anything is created."""
    tools = REQUIRED_TOOLS + (RPM_TOOLS if "rpm" in families(spec) else [])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise FleetError(f"lab up: {', '.join(missing)} not found; run scripts/setup to install the lab's packages")
    existing = spec.lab_dir
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    wanted = sum(int(n.hardware.nvme.size_gb * 1024**3) for n in spec.nodes if n.hardware.nvme)
    if wanted + DISK_MARGIN_BYTES > free:
        raise FleetError(f"lab up: the nodes' NVMe disks need {wanted / 1024**3:.1f} GB plus "
                         f"{DISK_MARGIN_BYTES // 1024**3} GB margin but {existing} has {free / 1024**3:.1f} GB free; "
                         "lower nvme.size_gb in the hardware file or free space")
    if Path("/sys/class/net", spec.bridge).exists():
        raise FleetError(f"lab up: bridge {spec.bridge} already exists but no lab state records it; "
                         f"delete it (`ip link del {spec.bridge}`) or use another lab name")


def up(spec: LabSpec, console: Console) -> LabState:
    """Create the lab described by spec, or grow the running one to it (more workers, all else as it
    is); on any failure remove what this call created, then re-raise."""
    require_root("lab up")
    existing = LabState.load(spec.lab_dir)
    if existing is not None:
        if all_running(existing):
            if existing.spec_data == spec.model_dump(mode="json"):
                console.print(f"lab up: the lab in {spec.lab_dir} is already up as asked")
                return existing
            if (added := added_workers(existing.spec, spec)) is not None:
                grow(existing, spec, added, console)
                return existing
            raise FleetError(f"lab up: a different lab is up in {spec.lab_dir}; a running lab only grows (more "
                             "--nodes, everything else as it was brought up): `ascend-fleet lab down` first")
        console.print(f"a previous lab in {spec.lab_dir} did not finish cleanly ({stopped_processes(existing)}): "
                      "removing its leftovers")
        down(spec.lab_dir)
    check_can_run(spec)
    state = LabState(spec.lab_dir, spec.model_dump(mode="json"), [])
    state.save()
    try:
        # The first lab's bases (debootstrap) build while the mirror fills (pip downloads, tiny models).
        with ThreadPoolExecutor(max_workers=1) as pool, console.status("creating the lab network, mirror and nodes"):
            bases_built = pool.submit(base_images, spec, console)
            public_key = create_login_key(state, spec)
            state.record("dir", path=str(fleet_state_dir(spec.lab_dir)))  # so `lab down` removes a rollout's record
            network.create_bridge(state, spec)
            start_mirror(state, spec)
            publish_profiles(spec.profiles, mirror_root(spec.lab_dir), os.uname().machine, console)
            lock_profiles(spec.profiles, f"{spec.mirror_url}/simple", locks_dir(spec.lab_dir), os.uname().machine,
                          console)
            if "rpm" in families(spec):
                rpmrepo.publish(mirror_root(spec.lab_dir), os.uname().machine)
            start_lxcfs(state, spec, console)
            bases = bases_built.result()
            for node in spec.nodes:
                make_node(state, spec, node, bases[node_family(node)], public_key)
        boot(spec, spec.nodes, console)
        write_known_hosts(spec)
    except BaseException:
        console.print("lab up failed: removing what it created")
        down(spec.lab_dir)
        raise
    return state


def node_family(node: NodeSpec) -> str:
    return FLAVOURS[node.hardware.os].family


def families(spec: LabSpec) -> set[str]:
    return {node_family(node) for node in spec.nodes}


def base_images(spec: LabSpec, console: Console) -> dict[str, Path]:
    """The base image of each family the lab's nodes run, by family."""
    return {family: base_image(spec.debian_upstream, console, family) for family in sorted(families(spec))}


def make_node(state: LabState, spec: LabSpec, node: NodeSpec, base: Path, public_key: str) -> None:
    """A node's links, NPU ports, overlay and disk, and its supervisor started (it boots)."""
    network.create_node_network(state, spec, node)
    network.create_npu_ports(state, spec, node)
    prepare_node(state, spec, node, base, public_key)
    start_node(state, spec, node)


def boot(spec: LabSpec, nodes: list[NodeSpec], console: Console) -> None:
    with console.status(f"booting {len(nodes)} nodes"):
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            list(pool.map(lambda node: wait_for_ssh(spec, node), nodes))


def added_workers(running: LabSpec, asked: LabSpec) -> list[NodeSpec] | None:
    """The workers `asked` adds to the `running` lab when it is that lab with more workers (whose
    rollout groups are laid out anew), else None."""
    def without_groups(nodes: list[NodeSpec]) -> list[NodeSpec]:
        return [node.model_copy(update={"groups": []}) for node in nodes]

    kept = asked.nodes[:len(running.nodes)]
    if (len(asked.nodes) <= len(running.nodes) or without_groups(kept) != without_groups(running.nodes)
            or running.model_dump(exclude={"nodes"}) != asked.model_dump(exclude={"nodes"})):
        return None
    return asked.nodes[len(running.nodes):]


def grow(state: LabState, spec: LabSpec, added: list[NodeSpec], console: Console) -> None:
    """Add workers to the running lab, made and booted as `up` makes them. The running nodes go on
    untouched but for /etc/hosts, which names the new ones. On failure, only what this added is removed."""
    running = state.spec
    mark = len(state.resources)
    public_key = login_public_key(spec.lab_dir)
    try:
        bases = base_images(spec, console)
        with console.status(f"adding {', '.join(node.name for node in added)}"):
            for node in added:
                make_node(state, spec, node, bases[node_family(node)], public_key)
        boot(spec, added, console)
        write_known_hosts(spec)
        for node in running.nodes:
            write_hosts(spec, node)
        state.spec_data = spec.model_dump(mode="json")
        state.save()
    except BaseException:
        console.print(f"lab up failed: removing {', '.join(node.name for node in added)}")
        remove_recorded(state, since=mark)
        state.save()
        write_known_hosts(running)
        with suppress(FleetError):
            for node in running.nodes:
                write_hosts(running, node)
        raise


def write_hosts(spec: LabSpec, node: NodeSpec) -> None:
    """A running node's /etc/hosts as the lab's nodes are now (as its first boot wrote it)."""
    hosts = render(TEMPLATES / "lab" / "node" / "etc" / "hosts.j2", node=node, nodes=spec.nodes,
                   host_address=spec.host_address)
    run([*ssh_argv(spec.lab_dir, node), "cat > /etc/hosts"], input=hosts, what=f"/etc/hosts on {node.name}")


def reset(lab_dir: Path, name: str, keep_nvme: bool) -> None:
    """Rebuild one node from bare metal: stop it, empty its overlay back to the base image, empty
    its NVMe (unless keep_nvme: a reinstalled OS on a server whose data disk survived), give it a new
    identity (host keys, machine id) and boot it. Its hardware file and address stay."""
    require_root("lab reset")
    state = LabState.require(lab_dir)
    spec = state.spec
    node = spec.node(name)
    entry = node_processes(state)[node.name]
    stop_recorded_process(entry)
    home = node_dir(lab_dir, node.name)
    wipe_root(home)
    if node.hardware.nvme and not keep_nvme:
        empty_nvme(home / "nvme")
    public_key = login_public_key(lab_dir)
    base = base_image(spec.debian_upstream, Console(quiet=True), node_family(node))
    prepare_root(spec, node, base, home / "upper", public_key)
    spawn_supervisor(state, entry, home)
    wait_for_ssh(spec, node)
    write_known_hosts(spec)  # its new host key


def power_off(lab_dir: Path, name: str) -> None:
    """The node loses power: its link goes down first, so nothing it does from then on reaches anyone
    (no goodbye, as keepalived's on a clean stop), then its systemd reboots at once (SIGRTMIN+15) and
    the node stays down (hold) until power_on."""
    state = LabState.require(lab_dir)
    spec, home = state.spec, node_dir(lab_dir, name)
    node = spec.node(name)
    (home / "hold").touch()
    run(["ip", "link", "set", spec.host_veth(node), "down"], what=f"cutting {name}'s link")
    for init in processes.children(int((home / "nspawn.pid").read_text())):
        with suppress(ProcessLookupError):
            os.kill(init, signal.SIGRTMIN + 15)


def power_on(lab_dir: Path, name: str) -> None:
    """Power comes back to a node power_off took down: it boots without the addresses it added while it ran
    (its namespace outlives it, a machine's memory does not), its link up."""
    state = LabState.require(lab_dir)
    spec, home = state.spec, node_dir(lab_dir, name)
    node = spec.node(name)
    netns = ["ip", "-n", spec.netns(node)]
    run([*netns, "addr", "flush", "dev", network.NODE_INTERFACE], what=f"clearing {name}'s addresses")
    run([*netns, "addr", "add", f"{node.address}/{spec.network.prefixlen}", "dev", network.NODE_INTERFACE])
    run(["ip", "link", "set", spec.host_veth(node), "up"], what=f"restoring {name}'s link")
    (home / "hold").unlink(missing_ok=True)


def ssh_dir(lab_dir: Path) -> Path:
    return lab_dir / "ssh"


def fleet_state_dir(lab_dir: Path) -> Path:
    """Where rollouts record this lab's drained instances and progress (hostdata `fleet_state_dir`)."""
    return lab_dir / "fleet"


def create_login_key(state: LabState, spec: LabSpec) -> str:
    keys = ssh_dir(spec.lab_dir)
    state.record("dir", path=str(keys))
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ascend-fleet-lab-{spec.name}",
         "-f", str(keys / "id_ed25519")], what="creating the lab's SSH key")
    return login_public_key(spec.lab_dir)


def login_public_key(lab_dir: Path) -> str:
    return (ssh_dir(lab_dir) / "id_ed25519.pub").read_text().strip()


def write_known_hosts(spec: LabSpec) -> None:
    """The lab's own known_hosts: every node by name and address, from the keys the lab made; and a
    bastion lab's ssh config, which reaches the other nodes through the bastion."""
    lines = []
    for node in spec.nodes:
        public = node_dir(spec.lab_dir, node.name) / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
        key_type, key = public.read_text().split()[:2]
        lines.append(f"{node.name},{node.address} {key_type} {key}")
    keys = ssh_dir(spec.lab_dir)
    (keys / "known_hosts").write_text("\n".join(lines) + "\n")
    if spec.jump_host:
        ssh_config_file(spec.lab_dir).write_text(render(TEMPLATES / "lab" / "ssh-config.j2", nodes=spec.nodes,
                                                        keys=keys, bastion=spec.jump_host.name))


def ssh_config_file(lab_dir: Path) -> Path:
    """A bastion lab's ssh config (write_known_hosts): no other lab has one."""
    return ssh_dir(lab_dir) / "config"


def ssh_argv(lab_dir: Path, node: NodeSpec) -> list[str]:
    """The ssh command line that logs into a node as root with the lab's key, verifying its host key;
    on a bastion lab, through the bastion, as its ssh config says."""
    keys, config = ssh_dir(lab_dir), ssh_config_file(lab_dir)
    through = ["-F", str(config), node.name] if config.exists() else [f"root@{node.address}"]
    return ["ssh", "-i", str(keys / "id_ed25519"), "-o", f"UserKnownHostsFile={keys / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
            "-o", "LogLevel=ERROR", *through]


REMOVERS = {
    "process": lambda entry: stop_recorded_process(entry),
    "loop-mount": remove_loop_mount,
    "mount": remove_mount,
    "cgroups": cgroups.remove,
    "netns": network.remove_netns,
    "link": network.remove_link,
    "bridge": network.remove_link,
    "nft-table": network.remove_nft_table,
    "dir": lambda entry: remove_dir(Path(entry["path"])),
    "lab": lambda entry: down(Path(entry["path"])),  # a lab of its own that a benchmark brought up
}


def stop_recorded_process(entry: dict) -> None:
    """Stop a recorded process and, for a node, the systemd-nspawn it was running (its node
    shuts down cleanly even if the supervisor itself crashed)."""
    if entry.get("pid"):
        processes.stop(entry["pid"], entry["marker"])
    child_pidfile = Path(entry.get("child_pidfile") or "/nonexistent")
    if child_pidfile.exists():
        processes.stop(int(child_pidfile.read_text()), entry["marker"])


def down(lab_dir: Path) -> bool:
    """Remove exactly what the lab recorded, newest first. Idempotent; False if there was no lab."""
    require_root("lab down")
    state = LabState.load(lab_dir)
    if state is None:
        return False
    remove_recorded(state)
    state.remove()
    for leftover in (lab_dir / "nodes", lab_dir):
        if leftover.is_dir() and not any(leftover.iterdir()):
            leftover.rmdir()
    return True


def remove_recorded(state: LabState, since: int = 0) -> None:
    """Remove what the state recorded from entry `since` on, newest first, and forget it. The nodes
    first, side by side: each is an orderly shutdown of its own systemd (seconds each)."""
    entries = state.resources[since:]
    nodes = [entry for entry in entries if entry["kind"] == "process" and entry["role"].startswith("node ")]
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(stop_recorded_process, nodes))
    for entry in reversed(entries):
        REMOVERS[entry["kind"]](entry)
    del state.resources[since:]


def remove_dir(path: Path) -> None:
    """rm -r, but never through a mount that is still there (it would empty a real filesystem)."""
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
               if line.split()[1].startswith(str(path) + "/")]
    if mounted:
        raise FleetError(f"lab down: {mounted[0]} is still mounted; unmount it, then run `lab down` again")
    shutil.rmtree(path, ignore_errors=True)


def node_processes(state: LabState) -> dict[str, dict]:
    """Each node's supervisor entry, by node name."""
    return {entry["role"].removeprefix("node "): entry for entry in state.find("process")
            if entry["role"].startswith("node ")}


def stopped_processes(state: LabState) -> str:
    """Which of the lab's processes are gone, each with the last words of its log: read before
    `lab down` removes the lab's directory, logs and all."""
    return "; ".join(
        f"{entry['role']} stopped, its log ends: {processes.last_words(Path(entry['log'])) if 'log' in entry else '-'}"
        for entry in state.find("process")
        if not (entry.get("pid") and processes.is_ours(entry["pid"], entry["marker"]))) or "none stopped"


def all_running(state: LabState) -> bool:
    return bool(state.find("process")) and all(
        entry.get("pid") and processes.is_ours(entry["pid"], entry["marker"]) for entry in state.find("process"))


def node_status(state: LabState, node: NodeSpec) -> dict:
    """What `lab status` shows of one node, read from the host without logging in."""
    home = node_dir(state.lab_dir, node.name)
    supervisor = node_processes(state).get(node.name, {})
    supervised = bool(supervisor.get("pid")) and processes.is_ours(supervisor["pid"], supervisor["marker"])
    boot_id = _boot_id(home) if supervised else None
    if not supervised:
        condition = "stopped"
    elif (home / "hold").exists() and boot_id is None:
        condition = "held down"
    else:
        condition = "running" if boot_id else "booting"
    return {
        "name": node.name, "role": node.role, "groups": node.groups, "address": node.address,
        "state": condition, "boot_id": boot_id, "boots": _boots(home), "supervisor_pid": supervisor.get("pid"),
        "chip": node.hardware.chip, "npus": node.hardware.npus,
        "nvme": node.hardware.nvme.model_dump() if node.hardware.nvme else None,
    }


def _boots(home: Path) -> int:
    """How many times the node has booted since `lab up` (the supervisor logs each start)."""
    try:
        return (home / "console.log").read_text(errors="replace").count(" supervisor: boot ")
    except OSError:
        return 0


def _boot_id(home: Path) -> str | None:
    """The boot id the node's own systemd sees (nspawn gives each boot a fresh one)."""
    try:
        nspawn = (home / "nspawn.pid").read_text().strip()
        init = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()[0]
        return Path(f"/proc/{init}/root/proc/sys/kernel/random/boot_id").read_text().strip()
    except (OSError, IndexError):
        return None


def status(lab_dir: Path) -> dict:
    state = LabState.require(lab_dir)
    spec = state.spec
    mirror = next(iter(state.find("process", role="mirror")), {})
    return {
        "name": spec.name, "lab_dir": str(lab_dir), "subnet": spec.subnet, "bridge": spec.bridge,
        "bastion": spec.jump_host.name if spec.jump_host else None,
        "mirror": {"url": spec.mirror_url,
                   "running": bool(mirror.get("pid")) and processes.is_ours(mirror["pid"], mirror["marker"])},
        "ssh_key": str(ssh_dir(lab_dir) / "id_ed25519"), "known_hosts": str(ssh_dir(lab_dir) / "known_hosts"),
        "ssh_config": str(ssh_config_file(lab_dir)) if spec.jump_host else None,
        "nodes": [node_status(state, node) for node in spec.nodes],
    }
