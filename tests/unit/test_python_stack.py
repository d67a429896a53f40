"""The serving stack's install: the pins as pip reads them, and the steps' commands run for real
against a local index whose wheels pin like PyPI's vllm and vllm-ascend do (each wants its own
`base`), so one pip run fails as on a real node and the upstream sequence succeeds."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File, Md5File, Sha1File, Sha256File

from ascend_fleet.config.profile import PipBuild, PipLocked, PipRemoval, PipStep
from ascend_fleet.core.node_layout import ANSWER_CACHE_DIR, PIP_LOCK_DIR, WHEEL_DIR, WHEELS_HELPER
from ascend_fleet.facts.ascend import PipCheck, PipPackages
from ascend_fleet.fleet.profile_check import pip_environment
from ascend_fleet.operations import python_stack
from ascend_fleet.operations.python_stack import satisfies
from tests.fakehost import FakeHost, commands, new_file, uploads

# front pins base 2.0 as PyPI's vllm pins its torch; plugin pins base 1.0 as vllm-ascend pins its own.
WHEELS = {("front", "1.0"): ["base==2.0"], ("plugin", "1.0"): ["base==1.0"], ("base", "1.0"): [],
          ("base", "2.0"): []}
STEPS = [PipStep(["front==1.0"], []), PipStep(["plugin==1.0", "base==1.0"], [])]


def pinned_steps(installed: dict[str, str], venv: str, index_url: str) -> tuple[list[str], list[str]]:
    fake = FakeHost({PipPackages: installed})
    return commands(python_stack.pinned, fake, venv=venv, steps=STEPS, index_url=index_url), fake.noops


def write_wheel(directory: Path, name: str, version: str, requires: list[str]) -> None:
    dist_info = f"{name}-{version}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                        *(f"Requires-Dist: {r}\n" for r in requires)])
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{name}.py", f"VERSION = {version!r}\n")
        wheel.writestr(f"{dist_info}/METADATA", metadata)
        wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist_info}/RECORD", "")


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> str:
    """A PEP 503 index on disk holding WHEELS."""
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    for (name, version), requires in WHEELS.items():
        write_wheel(files, name, version, requires)
    for name in {name for name, _ in WHEELS}:
        page = root / "simple" / name
        page.mkdir(parents=True)
        links = "".join(f'<a href="../../files/{w.name}">{w.name}</a>\n' for w in files.glob(f"{name}-*.whl"))
        (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (root / "simple").as_uri()


@pytest.fixture
def venv(tmp_path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(tmp_path / "venv")],
                   check=True)
    return tmp_path / "venv"


def run(command: str) -> subprocess.CompletedProcess:
    # Only the command's own indexes: this machine's pip config adds find-links and indexes of its own.
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=pip_environment(dict(os.environ)),
                          timeout=300)


def installed_in(venv: Path) -> dict[str, str]:
    listing = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import front, plugin, base; print(front.VERSION, plugin.VERSION, base.VERSION)"],
                             capture_output=True, text=True)
    return listing.stdout.split() and dict(zip(["front", "plugin", "base"], listing.stdout.split()))


@pytest.mark.parametrize("installed, requirement, ok", [
    ({"torch": "2.13.0+cpu"}, "torch==2.13.0", True),   # a pin without a label takes any build of that release
    ({"vllm": "0.32.0+cpu"}, "vllm==0.32.0+cpu", True),
    ({"vllm": "0.32.0"}, "vllm==0.32.0+cpu", False),    # the simulated server is not the CPU build
    ({"vllm": "0.13.0"}, "vllm==0.32.0+cpu", False),
    ({}, "torch==2.13.0", False),                       # not installed
    ({"numpy": "1.26.4"}, "numpy<2", True),             # CANN's Python dependencies: their range counts
    ({"numpy": "2.2.0"}, "numpy<2", False),
    ({"torch-npu": "2.8.0.post2"}, "torch_npu==2.8.0.post2", True),  # names as PEP 503 normalizes them
])
def test_a_requirement_is_met_as_pip_reads_it(installed, requirement, ok):
    assert satisfies(installed, requirement) is ok


def test_one_pip_run_of_every_pin_fails_where_the_steps_succeed_and_a_rerun_changes_nothing(index, venv):
    pip = f"{venv}/bin/python -m pip --disable-pip-version-check"
    one_shot = run(f"{pip} install --index-url {index} front==1.0 plugin==1.0 base==1.0")
    assert one_shot.returncode != 0 and "ResolutionImpossible" in one_shot.stderr

    steps, noops = pinned_steps({}, str(venv), index)
    assert len(steps) == 2 and not noops
    for command in steps:
        result = run(command)
        assert result.returncode == 0, result.stderr
    assert installed_in(venv) == {"front": "1.0", "plugin": "1.0", "base": "1.0"}  # the last step moved base

    steps, noops = pinned_steps({"front": "1.0", "plugin": "1.0", "base": "1.0"}, str(venv), index)
    assert steps == [] and noops == ["front==1.0, plugin==1.0, base==1.0 installed"]


def test_a_rerun_starts_at_the_first_step_with_an_unmet_requirement():
    steps, _ = pinned_steps({"front": "1.0", "plugin": "0.9", "base": "1.0"}, "/opt/venv", "http://mirror/simple")
    assert len(steps) == 1 and steps[0].endswith("plugin==1.0 base==1.0")
    steps, _ = pinned_steps({"front": "0.9", "plugin": "1.0", "base": "1.0"}, "/opt/venv", "http://mirror/simple")
    assert [s.split()[-1] for s in steps] == ["front==1.0", "base==1.0"]  # a new front moves base: step 2 again
    assert all("--trusted-host mirror" in s for s in steps)  # a plain-http index is trusted by its host


def test_a_step_adds_its_own_indexes_to_the_main_one():
    step = PipStep(["vllm-ascend==0.23.0"], ["https://download.pytorch.org/whl/cpu/", "https://example.org/pypi"])
    (command,) = commands(python_stack.pinned, FakeHost({PipPackages: {}}), venv="/v",
                          index_url="https://pypi.org/simple", steps=[step])
    assert ("--index-url https://pypi.org/simple --extra-index-url https://download.pytorch.org/whl/cpu/ "
            "--extra-index-url https://example.org/pypi vllm-ascend==0.23.0") in command


def test_only_the_seeder_installs_the_stack_first_and_each_step_tries_the_peers_wheels_before_the_index():
    stack = dict(venv="/opt/vllm", steps=STEPS, index_url="https://pypi.org/simple", peer_urls=["http://worker2:8090"])
    others = FakeHost(name="worker2")
    assert commands(python_stack.pinned_seeded, others, seeder="worker1", **stack) == [] and others.noops
    steps = commands(python_stack.pinned_seeded, FakeHost({PipPackages: {}, **new_file(WHEELS_HELPER)}),
                     seeder="worker1", **stack)
    assert uploads(steps) == {WHEELS_HELPER: python_stack.WHEELS_HELPER_SOURCE.read_bytes()}
    fetch, *installs = [step for step in steps if isinstance(step, str)]
    assert fetch.startswith(f"/opt/vllm/bin/python {WHEELS_HELPER} ") and fetch.endswith("--peer http://worker2:8090")
    pip = "/opt/vllm/bin/python -m pip --quiet --disable-pip-version-check"
    assert [step.split(" 2>/dev/null || ")[0] for step in installs] == [
        f"{pip} install --no-index --find-links {WHEEL_DIR} {requirement}" for requirement in ("front==1.0",
                                                                                               "plugin==1.0 base==1.0")]


def test_only_installed_distributions_are_uninstalled_by_their_normalized_names():
    fake = FakeHost({PipPackages: {"torch-npu": "2.8.0", "vllm": "0.13.0"}})
    assert commands(python_stack.absent, fake, venv="/opt/vllm", packages=["torch_npu", "triton"]) == [
        "/opt/vllm/bin/python -m pip uninstall --yes --quiet --disable-pip-version-check torch_npu"]
    assert commands(python_stack.absent, fake, venv="/opt/vllm", packages=["triton"]) == []
    assert fake.noops == ["triton not installed"]


# --- Uninstalls and builds over a pin, where upstream's image runs them (vllm-ascend 0.18.0's Dockerfile) ---

BUILD = PipBuild("base", "1.0.post1+gitabc", "base-1.0.post1+gitabc-py3-none-any.whl", "b" * 64,
                 "https://builds.example/v/", [])
UPSTREAM_ORDER = [PipStep(["front==1.0"], []), PipRemoval(["cuda-base"]), PipStep(["plugin==1.0", "base==1.0"], []),
                  BUILD]


def upstream_commands(installed: dict[str, str]) -> tuple[list[str], list[str]]:
    fake = FakeHost({PipPackages: installed})
    yielded = commands(python_stack.pinned, fake, venv="/v", steps=UPSTREAM_ORDER, index_url="https://pypi.org/simple")
    return [str(c.get_raw_value()) if hasattr(c, "get_raw_value") else c for c in yielded], fake.noops


def test_a_build_over_a_pin_meets_the_pin_it_replaces_so_a_rerun_changes_nothing():
    done = {"front": "1.0", "plugin": "1.0", "base": "1.0.post1+gitabc"}
    assert upstream_commands(done) == ([], ["front==1.0, cuda-base absent, plugin==1.0, base==1.0, "
                                            "base 1.0.post1+gitabc over its pin installed"])


def test_the_pin_in_place_of_the_build_reruns_only_the_build_from_its_url_with_its_sha256():
    (command,), _ = upstream_commands({"front": "1.0", "plugin": "1.0", "base": "1.0"})
    assert command == ("/v/bin/python -m pip --quiet --disable-pip-version-check install --no-deps "
                       f"'https://builds.example/v/base-1.0.post1%2Bgitabc-py3-none-any.whl#sha256={'b' * 64}'")


def test_a_package_an_uninstall_step_removes_reruns_from_that_step_in_order():
    found, _ = upstream_commands({"front": "1.0", "plugin": "1.0", "base": "1.0.post1+gitabc", "cuda-base": "3.6"})
    assert [c.split("--disable-pip-version-check ")[1].split()[0:2] for c in found] == [
        ["uninstall", "--yes"], ["install", "--index-url"], ["install", "--no-deps"]]


def test_with_wheel_peers_a_build_from_the_index_goes_through_the_verified_wheels(venv):
    """As an install's wheels: from the verified wheels if a peer had it, else downloaded, checked by the
    helper against the index and admitted, so the fleet takes it from the origin once."""
    build = PipBuild("base", "2.0", "base-2.0-py3-none-any.whl", "a" * 64, "index", [])
    helper_in_place = {File: {"mode": 755, "user": "root", "group": "root", "size": 1},
                       Sha1File: None, Sha256File: None, Md5File: None, Directory: None}
    *_, command = commands(python_stack.pinned, FakeHost({PipPackages: {}, **helper_in_place}), venv=str(venv),
                           steps=[build], index_url="http://mirror/simple", peer_urls=["http://peer:8090"])
    text = command.get_raw_value()
    assert text.startswith("printf '%s\\n' 'base==2.0 --hash=sha256:" + "a" * 64 + "' | ")
    assert "--no-index --find-links" in text and "--admit" in text and "download --no-deps" in text, text


def test_a_build_from_the_index_is_installed_alone_against_its_sha256(index, venv, tmp_path):
    """The lab's builds come from its index (source: index): pip refuses a file of another sha256."""
    files = Path(index.removeprefix("file://")).parent / "files"
    wheel = next(files.glob("base-2.0-*.whl"))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    for sha256, ok in (("0" * 64, False), (digest, True)):
        build = PipBuild("base", "2.0", wheel.name, sha256, "index", [])
        (command,) = commands(python_stack.pinned, FakeHost({PipPackages: {}}), venv=str(venv), steps=[build],
                              index_url=index)
        result = run(command.get_raw_value())
        assert (result.returncode == 0) is ok, result.stderr
    assert run(f"{venv}/bin/python -c 'import base; print(base.VERSION)'").stdout.strip() == "2.0"


def pip_check_says(venv: Path, answers: Path) -> list[str]:
    """PipCheck's command run here (its answers kept in answers), read as the fact reads it."""
    result = run(PipCheck().command(str(venv)).replace(ANSWER_CACHE_DIR, str(answers)))
    assert result.returncode == 0, result.stderr
    return PipCheck().process(result.stdout.splitlines())


def test_pip_check_runs_again_only_when_the_venvs_distributions_changed(index, venv, tmp_path):
    """A no-op rerun reuses the node's last pip check answer (about 2 s of metadata reading with the
    serving stack); an install or uninstall since is read afresh."""
    pip = f"{venv}/bin/python -m pip --disable-pip-version-check"
    answers = tmp_path / "answers"
    assert run(f"{pip} install --no-deps --index-url {index} front==1.0 base==1.0").returncode == 0
    broken = [line for line in pip_check_says(venv, answers) if line.startswith("front ")]
    assert broken == ["front 1.0 has requirement base==2.0, but you have base 1.0."]
    [cache] = answers.iterdir()
    key = cache.read_text().splitlines()[0]
    cache.write_text(f"{key}\nkept answer\n")  # the same distributions: the kept answer, no pip check
    assert pip_check_says(venv, answers) == ["kept answer"]
    assert run(f"{pip} install --no-deps --index-url {index} base==2.0").returncode == 0
    assert not [line for line in pip_check_says(venv, answers) if line.startswith("front ") or line == "kept answer"]


def lock_of(index: str, versions: dict[str, str], corrupt: str | None = None) -> PipLocked:
    """A lock of the index's wheels at versions, as `profile lock` writes one; corrupt: a name whose hash is wrong."""
    files = Path(index.removeprefix("file://")).parent / "files"
    lines = []
    for name, version in versions.items():
        digest = hashlib.sha256((files / f"{name}-{version}-py3-none-any.whl").read_bytes()).hexdigest()
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{'0' * 64 if name == corrupt else digest}\n")
    return PipLocked("site.x86_64-py3.11.txt", "".join(lines), versions, [])


def test_a_lock_installs_exactly_its_pins_in_one_pip_run_and_a_rerun_changes_nothing(index, venv, tmp_path):
    # The lock is the two steps' outcome as one set: base 1.0 under front's base==2.0, which no resolution allows.
    lock = lock_of(index, {"front": "1.0", "plugin": "1.0", "base": "1.0"})
    node_path = f"{PIP_LOCK_DIR}/{lock.name}"
    steps = commands(python_stack.pinned, FakeHost({PipPackages: {}, **new_file(node_path)}), venv=str(venv),
                     steps=[lock], index_url=index)
    assert uploads(steps) == {node_path: lock.text.encode()}
    (command,) = [step for step in steps if isinstance(step, str)]
    assert "--no-deps --require-hashes" in command
    (tmp_path / lock.name).write_text(lock.text)
    result = run(command.replace(node_path, str(tmp_path / lock.name)))
    assert result.returncode == 0, result.stderr
    assert installed_in(venv) == {"front": "1.0", "plugin": "1.0", "base": "1.0"}

    fake = FakeHost({PipPackages: {"front": "1.0", "plugin": "1.0", "base": "1.0"}})
    assert commands(python_stack.pinned, fake, venv=str(venv), steps=[lock], index_url=index) == []
    assert fake.noops == ["the 3 packages of site.x86_64-py3.11.txt installed"]


def test_a_file_that_is_not_the_locks_is_refused_and_nothing_is_installed(index, venv, tmp_path):
    lock = lock_of(index, {"front": "1.0", "plugin": "1.0", "base": "1.0"}, corrupt="plugin")
    steps = commands(python_stack.pinned, FakeHost({PipPackages: {}, **new_file(f"{PIP_LOCK_DIR}/{lock.name}")}),
                     venv=str(venv), steps=[lock], index_url=index)
    (command,) = [step for step in steps if isinstance(step, str)]
    (tmp_path / lock.name).write_text(lock.text)
    result = run(command.replace(f"{PIP_LOCK_DIR}/{lock.name}", str(tmp_path / lock.name)))
    assert result.returncode != 0 and "DO NOT MATCH THE HASHES" in result.stderr
    assert not installed_in(venv)


# Dockerfile@v0.23.0's order: uninstall both owners of site-packages/triton/, then install one of them again.
REINSTALLED_ORDER = [PipStep(["front==1.0"], []), PipStep(["plugin==1.0"], []),
                     PipRemoval(["cuda-kernels", "kernels"]), PipStep(["kernels==3.2.2"], [])]


def test_an_uninstall_of_what_a_later_step_installs_again_is_done_once_and_a_rerun_changes_nothing():
    fake = FakeHost({PipPackages: {"front": "1.0", "plugin": "1.0", "kernels": "3.2.2"}})
    assert commands(python_stack.pinned, fake, venv="/v", steps=REINSTALLED_ORDER, index_url="https://x/simple") == []
    assert fake.noops == ["front==1.0, plugin==1.0, cuda-kernels absent, kernels==3.2.2 installed"]
    # CUDA's build beside it again (a step moved it back): both go, and the one the stack wants comes back.
    fake = FakeHost({PipPackages: {"front": "1.0", "plugin": "1.0", "kernels": "3.2.2", "cuda-kernels": "3.6"}})
    found = [str(c.get_raw_value()) if hasattr(c, "get_raw_value") else c for c in
             commands(python_stack.pinned, fake, venv="/v", steps=REINSTALLED_ORDER, index_url="https://x/simple")]
    assert [c.split("--disable-pip-version-check ")[1] for c in found] == [
        "uninstall --yes cuda-kernels kernels", "install --index-url https://x/simple kernels==3.2.2"]


def test_with_a_lock_the_uninstalls_go_first_and_the_lock_installs_again_what_they_took():
    """Over a virtualenv an earlier run left CUDA's build in beside the one the lock holds (both own one
    directory, as triton and triton-ascend own site-packages/triton/): both go, then the lock puts its own
    back; after it, an uninstall would delete the shared files of a build the lock found in place."""
    lock = PipLocked("l.txt", "kernels==3.2.2 --hash=sha256:0\n", {"front": "1.0", "kernels": "3.2.2"}, [])
    steps = [PipRemoval(["cuda-kernels", "kernels"]), lock]
    fake = FakeHost({PipPackages: {"front": "1.0", "kernels": "3.2.2", "cuda-kernels": "3.6"},
                     **new_file(f"{PIP_LOCK_DIR}/l.txt")})
    found = [str(c.get_raw_value()) if hasattr(c, "get_raw_value") else c for c in
             commands(python_stack.pinned, fake, venv="/v", steps=steps, index_url="https://x/simple")
             if isinstance(c, str) or hasattr(c, "get_raw_value")]
    assert [c.split("--disable-pip-version-check ")[1] for c in found if " -m pip " in c] == [
        "uninstall --yes cuda-kernels kernels",
        f"install --index-url https://x/simple --no-deps --require-hashes -r {PIP_LOCK_DIR}/l.txt"]
    converged = FakeHost({PipPackages: {"front": "1.0", "kernels": "3.2.2"}})
    assert commands(python_stack.pinned, converged, venv="/v", steps=steps, index_url="https://x/simple") == []
    assert converged.noops == ["cuda-kernels absent, the 2 packages of l.txt installed"]
