"""Bad input to `lab up` is one clear line and creates nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.conftest import TEST_NET

BIN = Path(sys.executable).parent


def lab_up(tmp_path: Path, *args: str, user: str | None = None, path: str | None = None) -> subprocess.CompletedProcess:
    """path: a PATH for the command (tools of one's own before the system's)."""
    lab_dir = tmp_path / "lab"
    argv = [str(BIN / "ascend-fleet"), "lab", "up", "--name", "bad", "--lab-dir", str(lab_dir), *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *argv]
    env = {**os.environ, "PATH": path} if path else None
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def assert_refused(result: subprocess.CompletedProcess, tmp_path: Path, *phrases: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1, result.stderr
    for phrase in phrases:
        assert phrase in lines[0]
    # Nothing created: no lab directory, no namespace, no bridge.
    assert not (tmp_path / "lab").exists()
    assert not Path("/sys/class/net/af-bad-br").exists()
    assert not any(p.name.startswith("af-bad-") for p in Path("/run/netns").glob("*"))


def hardware(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hardware.yaml"
    path.write_text(text)
    return str(path)


def test_unknown_option_in_the_hardware_file(tmp_path):
    path = hardware(tmp_path, "defaults:\n  npus: 8\n  nvme:\n    size_gb: 4\n    mountpoint: /data\n")
    assert_refused(lab_up(tmp_path, "--hardware", path), tmp_path,
                   path, "nvme.mountpoint: unknown option", "size_gb, mount")


def test_unknown_node_in_the_hardware_file(tmp_path):
    path = hardware(tmp_path, "nodes:\n  worker7:\n    npus: 4\n")
    assert_refused(lab_up(tmp_path, "--nodes", "3", "--hardware", path), tmp_path, "nodes.worker7", "worker3")


def test_an_os_the_lab_cannot_make(tmp_path):
    path = hardware(tmp_path, "nodes:\n  worker2:\n    os: ubuntu-22.04\n")
    assert_refused(lab_up(tmp_path, "--nodes", "2", "--hardware", path), tmp_path,
                   "node worker2: os: Input should be", "'openeuler-24.03'")


def test_health_of_an_npu_the_node_does_not_have(tmp_path):
    path = hardware(tmp_path, "nodes:\n  worker1:\n    npus: 4\n    npu_health: {6: Critical}\n")
    assert_refused(lab_up(tmp_path, "--hardware", path), tmp_path, "worker1", "NPU 6", "0-3")


def test_an_unknown_preexisting_profile(tmp_path):
    path = hardware(tmp_path, "nodes:\n  worker2:\n    preexisting: {profile: lab-ancient}\n")
    assert_refused(lab_up(tmp_path, "--hardware", path), tmp_path,
                   "worker2", "preexisting.profile", "lab-ancient", "lab-previous")


def test_an_unknown_mirror_profile(tmp_path):
    assert_refused(lab_up(tmp_path, "--profile", "lab", "--profile", "lab-ancient"), tmp_path,
                   "profile 'lab-ancient'", "known profiles", "lab-previous")


def test_a_node_count_of_zero(tmp_path):
    """Refused where the option is declared (typer's min, as every count of the CLI): a usage error, exit 2."""
    result = lab_up(tmp_path, "--nodes", "0")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Invalid value for '--nodes': Input should be greater than or equal to 1" in result.stderr
    assert not (tmp_path / "lab").exists()
    assert not Path("/sys/class/net/af-bad-br").exists()


def test_a_disk_size_the_host_cannot_hold(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the disk check runs after the root check")
    path = hardware(tmp_path, "defaults:\n  nvme:\n    size_gb: 100000\n")
    assert_refused(lab_up(tmp_path, "--hardware", path), tmp_path, "NVMe disks need", "GB free", "nvme.size_gb")


def test_running_as_non_root(tmp_path):
    if os.geteuid() != 0:
        result = lab_up(tmp_path)
    else:
        tmp_path.chmod(0o777)
        result = lab_up(tmp_path, user="nobody")
    assert_refused(result, tmp_path, "must run as root", "`su -`")


def test_a_performance_model_that_is_no_models_config(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    path = hardware(tmp_path, f"defaults:\n  performance:\n    time_scale: 0.25\n    performs_as: {tmp_path / 'config.json'}\n")
    assert_refused(lab_up(tmp_path, "--hardware", path), tmp_path, "performance.performs_as", "config.json has no hidden_size")


def test_an_lxcfs_that_cannot_mount_is_quoted_and_the_lab_removed(tmp_path):
    """`lab up` removes the lab's directory when it fails, logs included: its error quotes lxcfs."""
    if os.geteuid() != 0:
        pytest.skip("lxcfs starts after the root check")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "lxcfs").write_text("#!/bin/sh\necho 'fuse: device not found, try modprobe fuse first' >&2\nexit 1\n")
    (fake / "lxcfs").chmod(0o755)
    net = TEST_NET + 7  # beside this run's lab tests' subnets
    result = lab_up(tmp_path, "--nodes", "1", "--subnet", f"10.213.{net}.0/24", path=f"{fake}:{os.environ['PATH']}")
    assert_refused(result, tmp_path, "lxcfs", "exited", "fuse: device not found, try modprobe fuse first")
