"""Lab nodes: an overlay on the cached base, a loop-mounted NVMe disk, and a supervised systemd-nspawn."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from ascend_fleet import TEMPLATES
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.templating import render
from ascend_fleet.lab import cgroups, processes, rpmrepo
from ascend_fleet.lab.base import RPM_DBPATH
from ascend_fleet.lab.flavours import FLAVOURS, Flavour
from ascend_fleet.lab.host import quiet, run
from ascend_fleet.lab.network import connect_from
from ascend_fleet.lab.sim.vendor import VendorVersions, preinstall_driver
from ascend_fleet.lab.spec import LabSpec, NodeSpec
from ascend_fleet.lab.state import LabState

# Files that must not be readable by others inside the node; programs the lab puts on it.
PRIVATE_DIRS = {"root/.ssh"}
PROGRAM_DIRS = {"usr/local/bin"}
BOOT_TIMEOUT_SECONDS = 120
NPU_PORTS_FILE = "npu-ports.json"
# An RPM-family node's real uname, and the kernel release its `uname` answers with (write_kernel).
LAB_UNAME = Path("/usr/lib/ascend-lab/uname")
KERNEL_RELEASE_FILE = Path("/usr/lib/ascend-lab/kernel-release")


def node_dir(lab_dir: Path, name: str) -> Path:
    return lab_dir / "nodes" / name


def prepare_node(state: LabState, spec: LabSpec, node: NodeSpec, base: Path, public_key: str) -> None:
    """Everything a node needs before its first boot: its overlay, its identity, its disk."""
    home = node_dir(spec.lab_dir, node.name)
    state.record("dir", path=str(home))
    for sub in ("upper", "ascend-lab"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    prepare_root(spec, node, base, home / "upper", public_key)
    hardware = node.hardware
    described = hardware.hardware_json(node.name, node.role, spec.npu_plane_json(node))
    (home / "ascend-lab" / "hardware.json").write_text(json.dumps(described, indent=2) + "\n")
    (home / "ascend-lab" / "mirror").write_text(spec.mirror_url + "\n")
    (home / "ascend-lab" / "meminfo").write_text(reported_meminfo(hardware.ram_gb))
    if hardware.nvme:
        create_nvme(state, home, hardware.nvme.size_gb)
    (home / "nspawn.json").write_text(json.dumps(nspawn_argv(spec, node, base, home)))
    # The supervisor resets the NPUs' ports before each boot (network.forget_npu_settings).
    npus = node.hardware.npus if node.role == "worker" else 0
    (home / NPU_PORTS_FILE).write_text(json.dumps({"netns": spec.netns(node), "npus": npus}))


def prepare_root(spec: LabSpec, node: NodeSpec, base: Path, upper: Path, public_key: str) -> None:
    """The node's own files over the base image: its identity and, on a used server, its old driver."""
    write_identity(spec, node, upper, public_key)
    write_kernel(node, base, upper)
    if node.hardware.preexisting.profile:
        preinstall_stack_driver(upper, node.hardware.preexisting.profile, base)


def wipe_root(home: Path) -> None:
    """Back to the bare base image: the overlay's upper layer (and nspawn's work dir beside it) emptied."""
    for layer in [home / "upper", *home.glob(".#upper*")]:
        shutil.rmtree(layer)
    (home / "upper").mkdir()


def empty_nvme(mountpoint: Path) -> None:
    """The node's NVMe as a disk that was never used: every file removed, the ext4 itself kept.
    Not mkfs: nodes booted since it was mounted hold the loop device in their mount namespaces."""
    for entry in mountpoint.iterdir():
        if entry.name == "lost+found":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def identity_context(spec: LabSpec, node: NodeSpec, public_key: str) -> dict:
    """What the node's templates (templates/lab/node) are rendered with."""
    return dict(node=node, nodes=spec.nodes, host_address=spec.host_address, mirror_url=spec.mirror_url,
                lab_public_key=public_key, compile_bytecode=spec.serves_real_vllm)


def write_identity(spec: LabSpec, node: NodeSpec, upper: Path, public_key: str) -> None:
    """Host name, host keys, machine id, the lab's login key and mirror settings, into the overlay."""
    context = identity_context(spec, node, public_key)
    render_tree(TEMPLATES / "lab" / "node", upper, context)
    enable_unit(upper, "ascend-lab-proc.service", "multi-user.target")
    if node.hardware.preexisting.cuda_env:
        render_tree(TEMPLATES / "lab" / "cuda", upper, context)
    flavour = FLAVOURS[node.hardware.os]
    if flavour.family == "rpm":
        write_rpm_identity(upper, flavour, {**context, "repositories": rpmrepo.REPOSITORIES,
                                            "release": rpmrepo.RELEASE})
    ssh_dir = upper / "etc" / "ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    for key in ssh_dir.glob("ssh_host_ed25519_key*"):
        key.unlink()
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node.name}",
         "-f", str(ssh_dir / "ssh_host_ed25519_key")], what=f"host key for {node.name}")
    (upper / "etc" / "machine-id").write_text(secrets.token_hex(16) + "\n")


def write_rpm_identity(upper: Path, flavour: Flavour, context: dict) -> None:
    """An RPM-family node's distribution: its os-release and release files, its dnf repositories on the
    lab mirror, no apt sources, and firewalld enabled (openEuler's default)."""
    shutil.rmtree(upper / "etc" / "apt")
    render_tree(TEMPLATES / "lab" / "rpm", upper, context)
    (upper / "usr" / "lib").mkdir(parents=True, exist_ok=True)
    (upper / "usr" / "lib" / "os-release").write_text(flavour.os_release)
    for name, content in flavour.release_files:
        (upper / "etc" / name).write_text(content)
    system_release = upper / "etc" / "system-release"
    system_release.unlink(missing_ok=True)
    system_release.symlink_to(flavour.release_files[0][0])
    enable_unit(upper, "firewalld.service", "multi-user.target")
    # What the distribution has installed before any deploy, in the node's rpm database (files: the base's).
    run(["rpm", "--root", str(upper), "--dbpath", RPM_DBPATH, "--install", "--justdb", "--nodeps", "--noscripts",
         *map(str, rpmrepo.preinstalled_rpms())], what="the node's preinstalled RPMs")


def write_kernel(node: NodeSpec, base: Path, upper: Path) -> None:
    """The kernel the node runs, with its headers where the distribution installs them (docs/sim-fidelity.md,
    "The running kernel"). A Debian node runs this machine's kernel, whose headers stand in as installed (no
    Debian archive has that kernel's package). An RPM-family node runs its distribution's kernel: `uname`
    answers with its release, and /lib/modules/<release>/build links to where kernel-devel puts the tree,
    as the kernel package's link does, until then leading nowhere."""
    if FLAVOURS[node.hardware.os].family == "debian":
        (upper / "usr" / "lib" / "modules" / os.uname().release / "build" / "include").mkdir(parents=True,
                                                                                             exist_ok=True)
        return
    release = rpmrepo.kernel_release(os.uname().machine)
    lab_dir = upper / LAB_UNAME.parent.relative_to("/")
    lab_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(base / "usr" / "bin" / "uname", lab_dir / "uname")
    (upper / KERNEL_RELEASE_FILE.relative_to("/")).write_text(release + "\n")
    wrapper = upper / "usr" / "bin" / "uname"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(render(TEMPLATES / "lab" / "uname.sh.j2", real=LAB_UNAME, release_file=KERNEL_RELEASE_FILE))
    wrapper.chmod(0o755)
    modules = upper / "usr" / "lib" / "modules" / release
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "build").unlink(missing_ok=True)
    (modules / "build").symlink_to(f"/usr/src/kernels/{release}")


def preinstall_stack_driver(upper: Path, profile_name: str, base: Path) -> None:
    """A profile's driver and firmware, installed and running from the first boot, as on a used server."""
    stack = VendorVersions.of(load_profile(profile_name).stack)
    preinstall_driver(upper, stack.driver, stack.driver_fw_compat, stack.firmware, accounts_from=base)


def enable_unit(root: Path, unit: str, target: str) -> None:
    """What `systemctl enable` does, done from outside the node before it boots."""
    wants = root / "etc" / "systemd" / "system" / f"{target}.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit
    link.unlink(missing_ok=True)
    link.symlink_to(f"../{unit}")


def render_tree(template_root: Path, target_root: Path, context: dict) -> None:
    for template in sorted(template_root.rglob("*.j2")):
        relative = template.relative_to(template_root).with_suffix("")
        target = target_root / relative
        private = any(str(relative).startswith(d) for d in PRIVATE_DIRS)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700 if private else 0o755)
        target.write_text(render(template, **context))
        target.chmod(0o600 if private else 0o755 if str(relative.parent) in PROGRAM_DIRS else 0o644)


def reported_meminfo(ram_gb: int) -> str:
    """/proc/meminfo as a server with ram_gb of RAM shows it (bound over the node's own)."""
    total_kb = ram_gb * 1024 * 1024
    return (f"MemTotal:       {total_kb} kB\nMemFree:        {total_kb * 9 // 10} kB\n"
            f"MemAvailable:   {total_kb * 9 // 10} kB\nBuffers:               0 kB\n"
            f"Cached:         {total_kb // 20} kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n")


def create_nvme(state: LabState, home: Path, size_gb: float) -> None:
    """A real ext4 filesystem of the given size, so a full disk is really full."""
    image, mountpoint = home / "nvme.img", home / "nvme"
    entry = state.record("loop-mount", image=str(image), mountpoint=str(mountpoint), device=None)
    run(["truncate", "-s", f"{int(size_gb * 1024**3)}", str(image)])
    run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image)],
        what=f"formatting {image}")
    entry["device"] = run(["losetup", "--find", "--show", str(image)], what=f"attaching {image}").stdout.strip()
    state.save()
    mountpoint.mkdir(exist_ok=True)
    run(["mount", entry["device"], str(mountpoint)], what=f"mounting {image}")


def remove_loop_mount(entry: dict) -> None:
    if Path(entry["mountpoint"]).is_mount():
        run(["umount", entry["mountpoint"]], what=f"unmounting {entry['mountpoint']}")
    device = entry.get("device")
    if device:
        backing = Path("/sys/block", Path(device).name, "loop", "backing_file")
        if backing.exists() and backing.read_text().strip() == entry["image"]:
            quiet(["losetup", "-d", device])


def nspawn_argv(spec: LabSpec, node: NodeSpec, base: Path, home: Path) -> list[str]:
    argv = [
        "systemd-nspawn", "--boot", "--quiet",
        # The machine name is the lab's and the node's: nspawn keeps per-machine state under
        # /run/systemd/nspawn/propagate/<machine>, which two labs' worker3 would share (one's exit
        # removed it under the other's boot: exit 255). The node's own name is its hostname.
        f"--machine={spec.name}-{node.name}", f"--hostname={node.name}",
        f"--directory={base}", f"--overlay={base}:{home / 'upper'}:/",
        # No machined or D-Bus on a plain host: don't register, and stay in the supervisor's cgroup.
        "--register=no", "--keep-unit",
        f"--network-namespace-path=/run/netns/{spec.netns(node)}",
        # The namespace is the node's own, as a server's network is: its nftables rules (the
        # instance firewall) touch nothing outside it.
        "--capability=CAP_NET_ADMIN",
        "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=pipe",
        f"--bind-ro={home / 'ascend-lab'}:/etc/ascend-lab",
        f"--bind-ro={lxcfs_dir(spec.lab_dir)}:/var/lib/lxcfs",
    ]
    if node.hardware.nvme:
        argv.append(f"--bind={home / 'nvme'}:{node.hardware.nvme.mount}")
    return argv


def lxcfs_dir(lab_dir: Path) -> Path:
    return lab_dir / "lxcfs"


def start_lxcfs(state: LabState, spec: LabSpec, console: Console) -> None:
    """One lxcfs for the lab: its /proc/uptime counts from each node's own boot.

    Started once more if the first one ends before its mount appears: it did so once in a CI run
    (the lab's directory, its log with it, was removed before anyone read why)."""
    mountpoint, logs = lxcfs_dir(spec.lab_dir), spec.lab_dir / "lxcfs-run"
    state.record("dir", path=str(logs))
    logs.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    state.record("mount", path=str(mountpoint))
    entry = state.record("process", role="lxcfs", marker=str(mountpoint), pid=None, log=str(logs / "lxcfs.log"))
    for attempt in (1, 2):
        # Its own pidfile: lxcfs locks the default one, which would allow one lab per machine.
        entry["pid"] = processes.spawn(["lxcfs", "--foreground", f"--pidfile={logs / 'lxcfs.pid'}", str(mountpoint)],
                                       logs / "lxcfs.log")
        state.save()
        problem = lxcfs_mount_problem(mountpoint, entry)
        if problem is None:
            return
        processes.stop(entry["pid"], entry["marker"])
        words = processes.last_words(logs / "lxcfs.log")
        if attempt == 2:
            raise FleetError(f"lab: lxcfs for {mountpoint} {problem} twice; its log ends: {words}")
        console.print(f"lab: lxcfs for {mountpoint} {problem} ({words}); starting it once more")


def lxcfs_mount_problem(mountpoint: Path, entry: dict, timeout: float = 30) -> str | None:
    """None once lxcfs's /proc/uptime is there; else what went wrong."""
    deadline = time.monotonic() + timeout
    while not (mountpoint / "proc" / "uptime").exists():
        if not processes.is_ours(entry["pid"], entry["marker"]):
            return "exited"
        if time.monotonic() > deadline:
            return f"did not mount it within {timeout:.0f} s"
        time.sleep(0.1)
    return None


def remove_mount(entry: dict) -> None:
    mountpoint = Path(entry["path"])
    # Not Path.is_mount(): a crashed FUSE daemon leaves a mount that cannot even be stat'ed.
    if f" {mountpoint} " in Path("/proc/mounts").read_text():
        quiet(["umount", "--lazy", str(mountpoint)])
    if mountpoint.is_dir():
        mountpoint.rmdir()


def start_node(state: LabState, spec: LabSpec, node: NodeSpec) -> None:
    home = node_dir(spec.lab_dir, node.name)
    # Recorded before the supervisor, so `lab down` removes them after its processes are gone.
    state.record("cgroups", node=node.name, paths=[str(path) for path in cgroups.node_cgroups(spec.name, node.name)])
    entry = state.record("process", role=f"node {node.name}", marker=str(home), pid=None,
                         child_pidfile=str(home / "nspawn.pid"), log=str(home / "console.log"))
    spawn_supervisor(state, entry, home)


def spawn_supervisor(state: LabState, entry: dict, home: Path) -> None:
    """Start the node's supervisor, in the node's own cgroups, and record its PID in the node's
    (existing) process entry."""
    own = [path for recorded in state.find("cgroups", node=home.name) for path in recorded["paths"]]
    entry["pid"] = processes.spawn([sys.executable, "-m", "ascend_fleet.lab.supervisor", str(home), *own],
                                   home / "console.log")
    state.save()


def wait_for_ssh(spec: LabSpec, node: NodeSpec, timeout: float = BOOT_TIMEOUT_SECONDS) -> None:
    """Return once the node's sshd answers with its banner: to this machine, or, behind a bastion (which
    keeps this machine off the other nodes), in the bastion's network."""
    jump_host = spec.jump_host
    netns = spec.netns(jump_host) if jump_host else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with connect_from(netns, node.address, 22, timeout=2) as conn:
                if conn.recv(16).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise FleetError(f"lab: node {node.name} ({node.address}) did not answer on SSH within {timeout:.0f}s; "
                     f"its console ends: {processes.last_words(node_dir(spec.lab_dir, node.name) / 'console.log')}")
