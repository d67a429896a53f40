"""From a lab node: the mirror carries what a deploy of the lab profiles fetches.

Vendor packages at the sha256 the profiles pin, a Python index from which a venv installs
torch_npu with nothing but the mirror, and the tiny model. A separate one-worker lab shows
a hardware file's `preexisting.profile` (a used server, its driver running from the first boot).
"""

import json
import shlex

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import MANIFEST_NAME
from ascend_fleet.lab.spec import DEFAULT_PROFILES
from tests.lab.conftest import TEST_LAB_DIR, TEST_NET, Lab, require_root
from tests.lab.test_sim_platform import (
    APT_LISTS,
    HDK_FLAGS,
    PKGS,
    RESET,
    RESTORE_HEADERS,
    Mirror,
    fetch,
    firmware_file,
    install_driver,
    sh,
)

pytestmark = pytest.mark.lab

LAB = load_profile("lab")
VENV = "/opt/mirror-test/venv"
MODEL = "models/lab/Qwen3-Tiny/v1"
NPU_CHECK = "import torch, torch_npu; print(torch.npu.is_available(), torch.npu.device_count())"


@pytest.fixture
def node(lab):
    """A worker with no Ascend software and no venv (other tests may have used it)."""
    node = lab.workers[1]
    lab.run(node, f"{RESET}; rm -rf {VENV}")
    yield node
    lab.run(node, RESTORE_HEADERS)


def arch_of(lab, node) -> str:
    return lab.run(node, "uname -m").stdout.strip()


def test_every_profiles_vendor_files_download_at_their_pinned_sha256(lab, node):
    arch, mirror_url = arch_of(lab, node), lab.mirror_url
    profiles = [load_profile(name) for name in DEFAULT_PROFILES]
    files = {name: profile.sha256_of(name) for profile in profiles for name in profile.vendor_files(arch).values()}
    sums = "".join(f"{digest}  {name}\n" for name, digest in files.items())
    urls = " ".join(f"-O {mirror_url}/files/{name}" for name in files)
    lab.run(node, f"cd {PKGS} && curl -fsS {urls} && printf %s {shlex.quote(sums)} | sha256sum --check --quiet")


def test_a_venv_installs_torch_npu_from_the_mirror_alone_and_sees_the_npus(lab, node):
    index = f"--index-url {lab.mirror_url}/simple/ --no-cache-dir"
    lab.run(node, f"{APT_LISTS} && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null")
    lab.run(node, f"python3 -m venv {VENV}")
    debian_pip = lab.run(node, f"{VENV}/bin/pip --version").stdout.split()[1]
    lab.run(node, f"{VENV}/bin/pip install -q {index} --upgrade pip "
                  f"&& {VENV}/bin/pip install -q {index} torch_npu=={LAB.stack.torch_npu}", timeout=900)
    assert lab.run(node, f"{VENV}/bin/pip --version").stdout.split()[1] != debian_pip
    installed = lab.run(node, f"{VENV}/bin/pip list --format=json").stdout
    versions = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(installed)}
    assert versions["torch-npu"] == LAB.stack.torch_npu and versions["torch"].startswith(LAB.stack.torch)

    mirror = Mirror(lab.mirror_url, arch_of(lab, node))
    low, high = install_driver(lab, node, mirror)
    firmware = firmware_file(mirror.firmware_in(low, high))
    toolkit = LAB.vendor_files(mirror.arch)["toolkit"]
    fetch(lab, node, mirror, firmware, toolkit)
    code, output = sh(lab, node, f"{PKGS}/{firmware} {HDK_FLAGS}")
    assert code in (0, 2), output
    lab.run(node, f"{PKGS}/{toolkit} --install --quiet --install-for-all")
    lab.reboot(node)

    npus = json.loads(lab.run(node, "cat /etc/ascend-lab/hardware.json").stdout)["npu_count"]
    set_env = "/usr/local/Ascend/cann/set_env.sh" if LAB.ops_era else "/usr/local/Ascend/ascend-toolkit/set_env.sh"
    check = lab.run(node, f". {set_env} && {VENV}/bin/python -c {shlex.quote(NPU_CHECK)}")
    assert check.stdout.split() == ["True", str(npus)]


def test_the_model_manifest_and_a_shard_download_and_match_their_sha256(lab, node):
    url = f"{lab.mirror_url}/{MODEL}"
    manifest = json.loads(lab.run(node, f"curl -fsS {url}/{MANIFEST_NAME}").stdout)
    shard = next(name for name in manifest["files"] if name.endswith(".safetensors"))
    digest = lab.run(node, f"curl -fsS {url}/{shard} | sha256sum").stdout.split()[0]
    assert digest == manifest["files"][shard]["sha256"]
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= set(manifest["files"])


def test_a_used_server_runs_its_preexisting_profiles_driver_from_the_first_boot(tmp_path):
    require_root()
    previous = load_profile("lab-previous").stack
    hardware = tmp_path / "hardware.yaml"
    hardware.write_text("defaults:\n  npus: 4\n  preexisting: {profile: lab-previous}\n")
    used = Lab(TEST_LAB_DIR.with_name(f"{TEST_LAB_DIR.name}-used"), f"u{TEST_NET}", f"10.213.{TEST_NET + 2}.0/24")
    used.down()
    used.up(1, "--hardware", str(hardware))
    try:
        assert f"Version={previous.driver}" in used.run("worker1", "cat /usr/local/Ascend/driver/version.info").stdout
        assert "Total Count                    : 4" in used.run("worker1", "npu-smi info -l").stdout
        board = used.run("worker1", "npu-smi info -t board -i 0").stdout
        assert f"Firmware Version               : {previous.firmware}" in board
        used.run("worker1", "id HwHiAiUser")
    finally:
        used.down()
