"""`ascend-fleet bundle` of the example site with the lab's profile, against a copy of the lab's mirror on
loopback: the lock, its files, the vendor packages and Debian 12's OS packages (from Debian's archive) in one
folder; `bundle verify` names a changed byte; a rerun fetches nothing again; a node arch or release the
bundle lacks is refused in one line; the site mirror's nginx serves it to pip and to apt."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from pyinfra.api import State
from rich.console import Console

from ascend_fleet import PROJECT_ROOT
from ascend_fleet.config.node_os import node_os
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.bundle_layout import MANIFEST
from ascend_fleet.core.model_tree import read_manifest
from ascend_fleet.core.package_index import file_sha256, write_simple_index
from ascend_fleet.fleet.bundle import build_bundle, coverage_refusal, os_coverage_refusal, rpms_lacking, verify_bundle
from ascend_fleet.fleet.check import inventory_problems
from ascend_fleet.fleet.os_repository import DEB_ARCH, fleet_packages
from ascend_fleet.fleet.profile_check import pip_environment
from ascend_fleet.lab import rpmrepo
from ascend_fleet.lab.publish import publish_python_packages, publish_tiny_model, publish_vendor_files
from ascend_fleet.stages.mirror import render_site_mirror_config

pytestmark = pytest.mark.network  # the lab mirror's real wheels come from PyPI once (the wheelhouse cache)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> str:
    """The lab's mirror for profile lab on x86_64 (stand-ins, real wheels, simulated .run files), on loopback."""
    root = tmp_path_factory.mktemp("mirror")
    profile = load_profile("lab")
    publish_python_packages(profile, root / "packages", "x86_64", Console(quiet=True))
    write_simple_index(root)
    publish_vendor_files([profile], root / "files", "x86_64")
    publish_tiny_model(root / "models", Console(quiet=True))
    rpmrepo.publish(root, "x86_64")  # openEuler's repositories of the lab, its stand-in RPMs in OS/
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def bundled(mirror, tmp_path_factory) -> tuple[Path, Path, dict]:
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(PROJECT_ROOT / "inventories", site / "inventories")
    shutil.copytree(PROJECT_ROOT / "group_data", site / "group_data")
    data = {"profile": "lab", "pip_index_url": f"{mirror}/simple", "vendor_mirror_url": f"{mirror}/files",
            "model": {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "http"}, "model_mirror_url": mirror}
    out = site / "bundle"
    lines: list[str] = []
    build_bundle(site / "inventories" / "prod.py", out, ["x86_64"], lines.append, override_data=data,
                 os_releases=["Debian 12", f"openEuler 24.03={mirror}/openeuler/{rpmrepo.RELEASE}"],
                 kernels=[RUNNING_KERNEL])
    return site, out, data


def apt_fetches(source: str, packages: list[str], state: Path) -> subprocess.CompletedProcess:
    """A node's apt with nothing installed and this source alone: download packages with every dependency."""
    (state / "lists" / "partial").mkdir(parents=True)
    (state / "archives" / "partial").mkdir(parents=True)
    (state / "status").touch()
    (state / "sources.list").write_text(f"deb [trusted=yes] {source} ./\n")
    options = [f"-oDir::State::Lists={state / 'lists'}", f"-oDir::State::status={state / 'status'}",
               f"-oDir::Cache={state}", f"-oDir::Cache::archives={state / 'archives'}",
               f"-oDir::Etc::sourcelist={state / 'sources.list'}", "-oDir::Etc::sourceparts=-",
               f"-oAPT::Architecture={DEB_ARCH['x86_64']}", "-oDebug::NoLocking=1"]
    updated = subprocess.run(["apt-get", "-q", *options, "update"], capture_output=True, text=True, timeout=300)
    if updated.returncode:
        return updated
    return subprocess.run(["apt-get", "-q", "-y", *options, "install", "--download-only", "--no-install-recommends",
                           *packages], capture_output=True, text=True, timeout=300)


# The kernel the site's openEuler nodes run (the lab's: docs/sim-fidelity.md, "The running kernel").
RUNNING_KERNEL = rpmrepo.kernel_release("x86_64")
# What a worker and a gateway of the example site install on Debian 12 (node_os.py's names).
DEBIAN_FLEET_PACKAGES = ["nginx-light", "nftables", "prometheus-node-exporter", "dkms", "gcc", "make", "pciutils",
                         "net-tools", "python3.11", "python3.11-venv", "prometheus", "prometheus-nginx-exporter"]


def test_the_bundle_holds_the_lock_its_files_and_the_vendor_packages_with_a_manifest(bundled):
    _, out, _ = bundled
    assert verify_bundle(out) == []
    listed = (out / MANIFEST).read_text()
    assert '"lock": "locks/lab.x86_64-py3.11.txt"' in listed
    lock = (out / "locks" / "lab.x86_64-py3.11.txt").read_text()
    packages = {path.name for path in (out / "packages").iterdir()}
    # Every file the lock pins is there (the stand-ins and the real wheels), and the builds over pins.
    for line in lock.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(" ")[0].split("==")
            assert any(p.startswith(f"{name.replace('-', '_')}-{version}-") for p in packages), line
    assert any(p.startswith("torch_npu-2.9.0.post1+gitdc51c2d-") for p in packages)
    profile = load_profile("lab")
    assert set(profile.vendor_files("x86_64").values()) == {p.name for p in (out / "files").iterdir()}
    assert (out / "simple" / "vllm-ascend" / "index.html").exists()
    # The model the workers serve, as the weights stager reads it from a mirror: the same manifest, every file.
    model = out / "models" / "lab" / "Qwen3-Tiny" / "v1"
    manifest = read_manifest(model)
    assert manifest["model_id"] == "lab/Qwen3-Tiny" and manifest["files"]
    assert all(file_sha256(model / name) == entry["sha256"] for name, entry in manifest["files"].items())


def test_the_control_machines_install_goes_in_and_installs_without_an_index(bundled, tmp_path):
    _, out, _ = bundled
    venv = tmp_path / "control"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--find-links",
                                str(out / "control"), "ascend-fleet"], capture_output=True, text=True,
                               env=pip_environment(dict(os.environ)), timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    version = subprocess.run([str(venv / "bin" / "ascend-fleet"), "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("ascend-fleet "), version.stderr
    assert not any(p.name.startswith("matplotlib-") for p in (out / "control").iterdir())  # optional: not carried


def test_the_os_packages_of_every_role_install_from_the_bundle_alone(bundled, tmp_path):
    """apt with the bundle's repository as its only source and nothing installed finds every package a
    Debian 12 worker and gateway install, and every dependency of theirs."""
    _, out, _ = bundled
    fetched = apt_fetches(f"file:{out}/os/debian-12-x86_64", DEBIAN_FLEET_PACKAGES, tmp_path)
    assert fetched.returncode == 0, fetched.stdout[-1500:] + fetched.stderr[-1500:]
    assert {p.name for p in (tmp_path / "archives").glob("*.deb")} <= {
        p.name for p in (out / "os" / "debian-12-x86_64").glob("*.deb")}


def test_an_openeuler_workers_os_packages_install_from_the_bundles_dnf_repository_alone(bundled, tmp_path):
    """dnf with the bundle's repository as its only one and nothing installed resolves every package an
    openEuler 24.03 worker installs (the lab's stand-ins: docs/sim-fidelity.md, "openEuler lab node")."""
    _, out, _ = bundled
    known = node_os("openEuler", "24.03")
    (tmp_path / "repos").mkdir()
    (tmp_path / "repos" / "bundle.repo").write_text(
        f"[bundle]\nname=bundle\nbaseurl=file://{out}/os/openeuler-24.03-x86_64\nenabled=1\ngpgcheck=0\n")
    fetched = subprocess.run(["dnf", "-q", "-y", f"--installroot={tmp_path / 'root'}", "--releasever=24.03",
                              f"--setopt=reposdir={tmp_path / 'repos'}", f"--setopt=cachedir={tmp_path / 'cache'}",
                              "download", "--resolve", "--alldeps", f"--destdir={tmp_path / 'got'}",
                              *fleet_packages(State(), known, [SimpleNamespace(is_worker=True, profile="lab",
                                                                               is_gateway=False, gateway_vip=None)],
                                              mirror_hosts=False)],
                             capture_output=True, text=True, timeout=300)
    assert fetched.returncode == 0, fetched.stdout[-1500:] + fetched.stderr[-1500:]
    assert {p.name for p in (tmp_path / "got").glob("*.rpm")} >= {"nginx-1.24.0-10.oe2403.x86_64.rpm"}


def test_the_bundle_carries_the_headers_of_the_kernel_the_nodes_run_not_the_newest(bundled):
    """`bundle --kernel`: the openEuler repository holds the running kernel's kernel-devel and kernel-headers
    (the lab's update/ has a later kernel's, which plain names would have taken), and preflight finds them."""
    _, out, _ = bundled
    known = node_os("openEuler", "24.03")
    rpms = {p.name for p in (out / "os" / "openeuler-24.03-x86_64").glob("kernel-*.rpm")}
    assert rpms == {f"kernel-devel-{RUNNING_KERNEL}.rpm", f"kernel-headers-{RUNNING_KERNEL}.rpm"}, rpms
    assert rpms_lacking(out, known, "x86_64", [f"kernel-devel-{RUNNING_KERNEL}"]) == []
    updated = f"kernel-devel-{rpmrepo.kernel_release('x86_64', rpmrepo.UPDATED_KERNEL)}"
    assert rpms_lacking(out, known, "x86_64", [updated]) == [updated]


def test_a_rerun_fetches_nothing_again(bundled):
    site, out, data = bundled
    carried = [*(out / "packages").iterdir(), *(out / "os" / "debian-12-x86_64").glob("*.deb")]
    before = {path: path.stat().st_mtime_ns for path in carried}
    build_bundle(site / "inventories" / "prod.py", out, ["x86_64"], lambda line: None, override_data=data,
                 os_releases=["Debian 12", f"openEuler 24.03={data['model_mirror_url']}/openeuler/{rpmrepo.RELEASE}"],
                 kernels=[RUNNING_KERNEL])
    assert {path: path.stat().st_mtime_ns for path in carried} == before
    assert verify_bundle(out) == []


def test_one_byte_changed_in_a_wheel_or_a_run_file_is_named_by_verify_and_by_check(bundled, tmp_path):
    site, out, data = bundled
    copy = tmp_path / "bundle"
    shutil.copytree(out, copy)
    wheel = next(p for p in (copy / "packages").iterdir() if p.name.startswith("vllm_ascend-0.18.0-"))
    run_file = next((copy / "files").iterdir())
    for changed in (wheel, run_file):
        content = bytearray(changed.read_bytes())
        content[len(content) // 2] ^= 1
        changed.write_bytes(bytes(content))
    problems = verify_bundle(copy)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"bundle {copy}: ") and "differs from the manifest" in problems[0]
    assert {f"packages/{wheel.name}", f"files/{run_file.name}"} == {line.split(": ")[1].split(" ")[0]
                                                                     for line in problems}
    # `ascend-fleet check` (no connection) names it for the hosts whose data names the bundle.
    checked = inventory_problems(site / "inventories" / "prod.py", site, {**data, "bundle_dir": str(copy)})
    assert any(f"bundle {copy}: packages/{wheel.name} differs from the manifest" in line for line in checked), checked


def test_weights_already_on_disk_go_in_with_a_manifest_made_for_them(bundled, tmp_path):
    site, _, data = bundled
    weights = tmp_path / "weights"
    (weights / "sub").mkdir(parents=True)
    (weights / "config.json").write_text("{}")
    (weights / "sub" / "model.safetensors").write_bytes(b"w" * 1000)
    out = tmp_path / "bundle"
    build_bundle(site / "inventories" / "prod.py", out, ["x86_64"], lambda line: None, override_data=data,
                 model_dirs=[weights])
    manifest = read_manifest(out / "models" / "lab" / "Qwen3-Tiny" / "v1")
    assert manifest == {"model_id": "lab/Qwen3-Tiny", "revision": "v1", "files": {
        "config.json": {"size": 2, "sha256": file_sha256(weights / "config.json")},
        "sub/model.safetensors": {"size": 1000, "sha256": file_sha256(weights / "sub" / "model.safetensors")}}}
    assert verify_bundle(out) == []


def test_a_node_arch_the_bundle_lacks_is_refused_in_one_line(bundled):
    _, out, _ = bundled
    assert coverage_refusal(out, "lab", "x86_64", "3.11") is None
    line = coverage_refusal(out, "lab", "aarch64", "3.11")
    assert line == (f"bundle {out} has no lab for aarch64 Python 3.11 (it has lab x86_64 Python 3.11); make it "
                    f"with `ascend-fleet bundle INVENTORY --out {out} --arch aarch64` where the indexes answer")
    assert os_coverage_refusal(out, node_os("Debian", "12"), "x86_64") is None
    assert os_coverage_refusal(out, node_os("Debian", "13"), "x86_64") == (
        f"bundle {out} has no OS packages for Debian 13 x86_64 (it has Debian 12 x86_64, openEuler 24.03 x86_64); "
        f"make it with `ascend-fleet bundle INVENTORY --out {out} --os 'Debian 13' --arch x86_64` where the archive "
        "answers")
    assert os_coverage_refusal(out, node_os("openEuler", "24.03"), "x86_64") is None


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is installed by scripts/setup (the lab's mirror)")
def test_the_site_mirrors_nginx_serves_the_bundle_as_pip_reads_it(bundled, tmp_path):
    """What the mirror stage serves (its nginx config over the bundle): pip takes every file of the lock from
    it, each checked against the lock's sha256, and nothing else answers."""
    _, out, _ = bundled
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "site.conf").write_text(render_site_mirror_config(port, str(out)).replace(
        f"listen {port};", f"listen 127.0.0.1:{port};"))
    # Its workers as this user: pytest's folders are its own (on a node the bundle's files are world-readable).
    user = "user root; " if os.geteuid() == 0 else ""
    (tmp_path / "nginx.conf").write_text(f"{user}pid {tmp_path}/nginx.pid; error_log stderr; daemon off; events {{}}\n"
                                         f"http {{ access_log off; include {tmp_path}/site.conf; }}\n")
    nginx = subprocess.Popen(["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                             stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if requests.get(f"{url}/simple/", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                                  "-r", str(out / "locks" / "lab.x86_64-py3.11.txt"), "--dest", str(tmp_path / "got"),
                                  "--index-url", f"{url}/simple"], capture_output=True, text=True,
                                 env=pip_environment(dict(os.environ)), timeout=600)
        assert fetched.returncode == 0, fetched.stderr[-2000:]
        assert requests.get(f"{url}/models/lab/Qwen3-Tiny/v1/ascend-fleet-manifest.json", timeout=5).ok
        assert requests.get(f"{url}/{MANIFEST}", timeout=5).ok
        assert requests.get(f"{url}/packages/", timeout=5).status_code == 403  # no listings but the index
        apt = apt_fetches(f"{url}/os/debian-12-x86_64", ["nginx-light", "nftables"], tmp_path / "apt")
        assert apt.returncode == 0, apt.stdout[-1500:] + apt.stderr[-1500:]
    finally:
        nginx.terminate()
        nginx.wait(timeout=30)
