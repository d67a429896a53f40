"""Each stage installs with the node's release's package manager and names (node_os.py), and
preflight refuses, in one line, a release some stage of the node cannot serve."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import State
from pyinfra.facts.server import Arch, LinuxDistribution

from ascend_fleet import stages
from ascend_fleet.config.node_os import node_os
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.bundle_layout import MANIFEST
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import BUNDLE_APT_SOURCE, BUNDLE_DNF_REPO, SITE_MIRROR_ROOT, unit_file
from ascend_fleet.facts.kernel import KernelHeaders
from ascend_fleet.facts.systemd import UnitState
from ascend_fleet.fleet.os_repository import fleet_packages, kernel_headers_packages, kernel_releases
from ascend_fleet.operations import placed, units
from ascend_fleet.stages import checks, context, firewall, monitoring, platform
from tests.fakehost import FakeHost, commands, fact, on

OPENEULER = {"name": "openEuler", "release_meta": {"VERSION_ID": "24.03"}}
DEBIAN = {"name": "Debian", "release_meta": {"VERSION_ID": "12"}}
FIREWALLD = "firewalld.service"


def unit_state(active: str, load: str = "loaded") -> dict:
    return {"LoadState": load, "ActiveState": active, "SubState": "", "Result": "", "NRestarts": "0",
            "last_line": "", "last_exit": ""}


KERNEL = "6.6.0-28.0.0.34.oe2403.aarch64"


def kernel_headers(installed=(), listed=(), kernel=KERNEL) -> dict:
    """KernelHeaders' answer for openEuler's kernel-devel and kernel-headers of `kernel`."""
    names = [f"kernel-devel-{kernel}", f"kernel-headers-{kernel}"]
    return {"kernel": kernel, "installed": [n for n in names if n in installed],
            "not_installed": [n for n in names if n not in installed], "listed": list(listed)}


def node(distribution: dict, firewalld: str = "active", load: str = "loaded") -> FakeHost:
    """A node whose running kernel's headers are installed (openEuler), or listed nowhere (Debian: the lab's)."""
    headers = (kernel_headers(installed=[f"kernel-devel-{KERNEL}", f"kernel-headers-{KERNEL}"])
               if distribution["name"] == "openEuler" else
               {"kernel": KERNEL, "installed": [], "not_installed": [f"linux-headers-{KERNEL}"], "listed": []})
    return FakeHost({LinuxDistribution: distribution, fact(UnitState, unit=FIREWALLD): unit_state(firewalld, load),
                     KernelHeaders: headers}, executing=False)


def role(worker=True, gateway=False, instance_firewall=True) -> SimpleNamespace:
    return SimpleNamespace(is_worker=worker, is_gateway=gateway, instance_firewall=instance_firewall, gateway_vip=None)


class Recorder:
    """Every operation a stage calls, as (operation, its arguments), instead of running it."""

    def __init__(self, monkeypatch, bundle_dir: str | None = None):
        self.calls: list[tuple[str, dict]] = []
        monkeypatch.setattr(context, "host_node_config",
                            lambda _host: SimpleNamespace(bundle_dir=bundle_dir, bundle_url="http://gateway:8070"))
        for module, names in ((context.apt, ["packages"]), (context.dnf, ["packages"]),
                              (context.files, ["put", "directory", "link", "file"]),
                              (monitoring.systemd, ["service", "daemon_reload"]),
                              (platform.server, ["group"]), (platform.accounts, ["user"]), (units, ["masked"]),
                              (firewall, ["nft_table", "nft_table_absent"]), (firewall.gates, ["stage_begins"]),
                              (context.bundle, ["dnf_packages"]),
                              (placed, ["file"])):
            for name in names:
                monkeypatch.setattr(module, name, self.recorder(f"{module.__name__.split('.')[-1]}.{name}"))

    def recorder(self, label):
        def record(**arguments):
            self.calls.append((label, arguments))
            return SimpleNamespace(will_change=False)
        return record

    def installs(self) -> list[tuple[str, list[str]]]:
        return [(label, arguments["packages"]) for label, arguments in self.calls if label.endswith("packages")]


@pytest.fixture
def recorder(monkeypatch):
    return Recorder(monkeypatch)


def run_firewall_stage(monkeypatch, fake: FakeHost) -> None:
    config = SimpleNamespace(is_worker=True, is_gateway=False, instance_firewall=True, gateway_vip=None)
    monkeypatch.setattr(firewall, "host_node_config", lambda _host: config)
    monkeypatch.setattr(firewall, "host_openings", lambda *_args: [])
    monkeypatch.setattr(firewall, "firewall_rules", lambda *_args: SimpleNamespace(text="", comment="c"))
    with on(fake):
        firewall.firewall_stage.__wrapped__()


def test_an_openeuler_worker_installs_with_dnf_and_openeulers_names_in_every_stage(monkeypatch, recorder):
    fake = node(OPENEULER)
    run_firewall_stage(monkeypatch, fake)
    with on(fake):
        platform.install_prerequisites()
        monitoring.npu_exporter("15s")
        context.nginx_installed()  # the peer server's and the gateway's
        context.os_packages("python3.11 with venv", context.python_packages(load_profile("lab"), context.host_os()))
    assert recorder.installs() == [
        ("dnf.packages", ["nftables"]),
        ("dnf.packages", ["dkms", "gcc", "make", "pciutils", "net-tools"]),
        ("dnf.packages", ["node_exporter"]),
        ("dnf.packages", ["nginx"]),
        ("dnf.packages", ["python3"]),
    ]
    services = [arguments["service"] for label, arguments in recorder.calls if label == "systemd.service"]
    assert "node_exporter" in services and "prometheus-node-exporter" not in services
    written = [arguments["dest"] for label, arguments in recorder.calls if label == "placed.file"]
    assert f"{unit_file('node_exporter.service')}.d/ascend-fleet.conf" in written
    assert not any(path.startswith("/etc/default/") for path in written)
    assert not any(label == "files.link" for label, _ in recorder.calls)  # no sites-enabled on openEuler


def test_a_debian_worker_keeps_debians_packages_and_defaults_files(monkeypatch, recorder):
    fake = node(DEBIAN, firewalld="inactive", load="not-found")  # no headers package of its kernel listed
    run_firewall_stage(monkeypatch, fake)
    with on(fake):
        platform.install_prerequisites()
        monitoring.npu_exporter("15s")
        context.nginx_installed()
    assert recorder.installs() == [("apt.packages", ["nftables"]),
                                   ("apt.packages", ["dkms", "gcc", "make", "pciutils", "net-tools"]),
                                   ("apt.packages", ["prometheus-node-exporter"]), ("apt.packages", ["nginx-light"])]
    # The first install brings the package lists up to date; the others do not ask their age again.
    assert [(arguments["update"], arguments["cache_time"]) for label, arguments in recorder.calls
            if label == "apt.packages"] == [(True, 3600), (False, None), (False, None), (False, None)]
    assert not any(label == "units.masked" for label, _ in recorder.calls)


def test_no_stage_calls_a_package_manager_but_through_the_nodes_release():
    """Every stage installs through context.os_packages, which asks node_os.py which manager and names."""
    offenders = []
    for path in Path(stages.__file__).parent.glob("*.py"):
        if path.name == "context.py":
            continue
        for call in ast.walk(ast.parse(path.read_text())):
            if (isinstance(call, ast.Attribute) and isinstance(call.value, ast.Name)
                    and call.value.id in ("apt", "dnf", "yum")):
                offenders.append(f"{path.name}: {call.value.id}.{call.attr}")
    assert offenders == []


def test_firewalld_is_masked_after_the_fleets_table_is_loaded(monkeypatch, recorder):
    run_firewall_stage(monkeypatch, node(OPENEULER))
    labels = [label for label, _ in recorder.calls]
    assert labels.index("firewall.nft_table") < labels.index("units.masked")
    assert [arguments["unit"] for label, arguments in recorder.calls if label == "units.masked"] == [FIREWALLD]


@pytest.mark.parametrize(("active", "load", "expected"), [
    ("active", "loaded", ["systemctl mask --now firewalld.service"]),
    ("inactive", "loaded", ["systemctl mask --now firewalld.service"]),  # stopped, but a boot would start it
    ("inactive", "masked", []),  # the rerun: done
    ("inactive", "not-found", []),  # no firewalld on the node
])
def test_masking_firewalld_changes_only_what_the_facts_say_is_not_done(active, load, expected):
    fake = node(OPENEULER, firewalld=active, load=load)
    assert commands(units.masked, fake, unit=FIREWALLD) == expected
    assert bool(fake.noops) == (not expected)


@pytest.mark.parametrize(("distribution", "release", "refusal"), [
    ("Kylin Linux Advanced Server", "V10", "worker1: Kylin Linux Advanced Server V10 is not served (served: "),
    ("openEuler", "20.03", "worker1: openEuler 20.03 is not served (served: "),
    ("openEuler", "22.03", "worker1: openEuler 22.03 is not served (served: "),
])
def test_a_release_no_stage_can_serve_is_refused_in_one_line_before_anything_changes(distribution, release, refusal):
    fake = node({"name": distribution, "release_meta": {"VERSION_ID": release}})
    with on(fake), pytest.raises(FleetError) as refused:
        checks.check_release(load_profile("lab"), role())
    message = str(refused.value)
    assert message.startswith(refusal) and "openEuler 24.03" in message
    assert message.endswith("reinstall the node with a served release") and "\n" not in message


def test_an_openeuler_gateway_is_refused_naming_the_package_no_source_gives():
    with on(node(OPENEULER)):
        refusal = checks.release_refusal(load_profile("lab"), role(worker=False, gateway=True))
    assert refusal == ("openEuler 24.03 has no known prometheus_args_file, nginx_exporter, nginx_exporter_args_file, "
                       "which the gateway role needs (docs/sim-fidelity.md, openEuler node data); give the role to a "
                       "node of another release")


def test_an_openeuler_2403_worker_passes():
    with on(node(OPENEULER)):
        assert checks.release_refusal(load_profile("lab"), role()) is None


def test_a_system_python_below_the_profiles_is_refused_unless_the_profile_names_its_packages():
    debian11 = {"name": "Debian", "release_meta": {"VERSION_ID": "11"}}
    profile = load_profile("lab")
    with on(node(debian11)):
        assert checks.release_refusal(profile, role()) == (
            "Debian 11's Python is 3.9, profile lab needs 3.11: name the packages that give it there in the "
            "profile's pip.python_packages['Debian 11'], or reinstall the node with a release whose Python is 3.11")
        sourced = profile.model_copy(update={"pip": profile.pip.model_copy(
            update={"python_packages": {"Debian 11": ["python3.11", "python3.11-venv"]}})})
        assert checks.release_refusal(sourced, role()) is None
        assert context.python_packages(sourced, node_os("Debian", "11")) == ["python3.11", "python3.11-venv"]


def test_firewalld_left_running_with_the_instance_firewall_off_is_refused():
    with on(node(OPENEULER)):
        refusal = checks.release_refusal(load_profile("lab"), role(instance_firewall=False))
    assert refusal.startswith("firewalld runs and rejects the fleet's ports, and instance_firewall is false")
    with on(node(OPENEULER, firewalld="inactive")):
        assert checks.release_refusal(load_profile("lab"), role(instance_firewall=False)) is None


def test_with_a_bundle_every_package_a_debian_worker_installs_comes_from_the_bundles_repository_alone(
        monkeypatch, tmp_path):
    """The bundle's repository (os_repository.fleet_packages) holds each package the stages install, and
    with bundle_dir apt reads that repository alone: a site's other sources do not answer offline."""
    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()
    release = "ab" * 32
    (bundle_dir / MANIFEST).write_text(json.dumps({"files": {"os/debian-12-x86_64/Release": release}}))
    recorder = Recorder(monkeypatch, bundle_dir=str(bundle_dir))
    sources = []
    monkeypatch.setattr(context.bundle, "apt_repository", lambda **arguments: sources.append(arguments))
    for groups, url in (([], "http://gateway:8070/os/debian-12-x86_64"),
                        (["mirror"], f"file://{SITE_MIRROR_ROOT}/os/debian-12-x86_64")):
        recorder.calls.clear()
        sources.clear()
        fake = node(DEBIAN, firewalld="inactive", load="not-found")
        fake.facts[Arch] = "x86_64"
        fake.groups = groups
        run_firewall_stage(monkeypatch, fake)
        with on(fake):
            platform.install_prerequisites()
            monitoring.npu_exporter("15s")
            context.nginx_installed()
            context.os_packages("python3.11 with venv", context.python_packages(load_profile("lab"), context.host_os()))
        assert [source["source"].splitlines()[-1] for source in sources] == [f"deb [trusted=yes] {url} ./"]
        assert release in sources[0]["source"]
        apt_calls = [arguments for label, arguments in recorder.calls if label == "apt.packages"]
        assert {(call.get("update"), call["extra_install_args"]) for call in apt_calls} == {
            (None, f"-oDir::Etc::sourcelist={BUNDLE_APT_SOURCE} -oDir::Etc::sourceparts=- -oAPT::Get::List-Cleanup=0")}
    worker = SimpleNamespace(is_worker=True, profile="lab", is_gateway=False, gateway_vip=None)
    installed = {name for _, packages in recorder.installs() for name in packages}
    assert installed and installed <= set(fleet_packages(State(), node_os("Debian", "12"), [worker],
                                                         mirror_hosts=False))


def test_with_a_bundle_an_openeuler_worker_installs_from_the_bundles_dnf_repository_alone(monkeypatch, tmp_path):
    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()
    repomd = "cd" * 32
    (bundle_dir / MANIFEST).write_text(json.dumps({"files": {"os/openeuler-24.03-x86_64/repodata/repomd.xml": repomd}}))
    recorder = Recorder(monkeypatch, bundle_dir=str(bundle_dir))
    fake = node(OPENEULER)
    fake.facts[Arch] = "x86_64"
    fake.groups = []
    run_firewall_stage(monkeypatch, fake)
    with on(fake):
        platform.install_prerequisites()
        monitoring.npu_exporter("15s")
        context.nginx_installed()
    repos = [arguments for label, arguments in recorder.calls if label == "files.put"]
    assert [repo["dest"] for repo in repos] == [BUNDLE_DNF_REPO]
    text = repos[0]["src"].getvalue()
    assert "baseurl=http://gateway:8070/os/openeuler-24.03-x86_64\n" in text and repomd in text, text
    # Not pyinfra's dnf.packages, which asks every repository of the node what provides each package.
    assert not any(label == "dnf.packages" for label, _ in recorder.calls)
    dnf_calls = [arguments for label, arguments in recorder.calls if label == "bundle.dnf_packages"]
    assert len(dnf_calls) == 4 and {call["repository"] for call in dnf_calls} == {"ascend-fleet-bundle"}
    worker = SimpleNamespace(is_worker=True, profile="lab", is_gateway=False, gateway_vip=None)
    installed = {name for _, packages in recorder.installs() for name in packages}
    assert installed <= set(fleet_packages(State(), node_os("openEuler", "24.03"), [worker], mirror_hosts=False))


def test_an_openeuler_worker_installs_the_running_kernels_headers_not_the_newest(monkeypatch, recorder):
    """Huawei's guide: kernel-devel-$(uname -r) and kernel-headers-$(uname -r); plain kernel-devel would take the
    repositories' newest, which the driver's DKMS build cannot use while the node runs an older kernel."""
    fake = node(OPENEULER)
    fake.facts[KernelHeaders] = kernel_headers(installed=[f"kernel-headers-{KERNEL}"],
                                               listed=[f"kernel-devel-{KERNEL}"])
    with on(fake):
        platform.install_prerequisites()
    assert recorder.installs() == [("dnf.packages", ["dkms", "gcc", "make", "pciutils", "net-tools"]),
                                   ("dnf.packages", [f"kernel-devel-{KERNEL}"])]


def test_the_running_kernels_headers_installed_change_nothing(monkeypatch, recorder):
    fake = node(OPENEULER)
    fake.facts[KernelHeaders] = kernel_headers(installed=[f"kernel-devel-{KERNEL}", f"kernel-headers-{KERNEL}"])
    with on(fake):
        platform.install_prerequisites()
    assert [label for label, _ in recorder.installs()] == ["dnf.packages"]  # the prerequisites alone
    assert fake.noops == [f"kernel-devel-{KERNEL}, kernel-headers-{KERNEL} installed"]


def run_kernel_headers_fact(tmp_path, package_manager, templates, ask_repositories, installed, listed) -> dict:
    """The fact's command in a shell whose uname, rpm, dnf, dpkg-query and apt-cache answer from these lists."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    stubs = {"uname": f"echo {KERNEL}",
             "rpm": f'case " {" ".join(installed)} " in *" $2 "*) exit 0;; esac; exit 1',
             "dnf": f'case " {" ".join(listed)} " in *" $3 "*) echo "$3";; esac',
             "dpkg-query": f'case " {" ".join(installed)} " in *" $3 "*) echo "install ok installed";; esac',
             "apt-cache": f'case " {" ".join(listed)} " in *" $2 "*) exit 0;; esac; exit 1'}
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    command = KernelHeaders().command(package_manager, templates, ask_repositories)
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    return KernelHeaders().process(output.splitlines())


def test_the_kernel_headers_fact_reads_the_running_kernel_what_is_installed_and_what_the_repositories_list(tmp_path):
    templates = node_os("openEuler", "24.03").kernel_headers
    devel, headers = f"kernel-devel-{KERNEL}", f"kernel-headers-{KERNEL}"
    assert run_kernel_headers_fact(tmp_path, "dnf", templates, True, [headers], [devel]) == {
        "kernel": KERNEL, "installed": [headers], "not_installed": [devel], "listed": [devel]}
    # From a bundle the node's own repositories are not asked (offline, dnf would wait on each).
    asked = run_kernel_headers_fact(tmp_path / "bundle", "dnf", templates, False, [], [devel, headers])
    assert asked["listed"] == [] and asked["not_installed"] == [devel, headers]
    debian = run_kernel_headers_fact(tmp_path / "debian", "apt", ("linux-headers-{kernel}",), True, [], [])
    assert debian == {"kernel": KERNEL, "installed": [], "not_installed": [f"linux-headers-{KERNEL}"], "listed": []}


def test_preflight_refuses_in_one_line_a_node_whose_running_kernels_headers_no_repository_has(monkeypatch):
    config = SimpleNamespace(bundle_dir=None)
    monkeypatch.setattr(context, "host_node_config", lambda _host: config)
    known = node_os("openEuler", "24.03")
    fake = node(OPENEULER)
    fake.facts[KernelHeaders] = kernel_headers(installed=[f"kernel-headers-{KERNEL}"])
    with on(fake):
        assert checks.kernel_headers_problem(config, known) == (
            f"the running kernel {KERNEL}'s kernel-devel-{KERNEL} are in none of its repositories, and the driver "
            "builds against them; boot a kernel whose headers a repository has (`dnf upgrade kernel`, reboot), or "
            "add a repository that has them")
    for listed in ([f"kernel-devel-{KERNEL}"], []):
        fake.facts[KernelHeaders] = kernel_headers(installed=[f"kernel-headers-{KERNEL}"] if listed else
                                                   [f"kernel-devel-{KERNEL}", f"kernel-headers-{KERNEL}"],
                                                   listed=listed)
        with on(fake):
            assert checks.kernel_headers_problem(config, known) is None


def test_with_a_bundle_preflight_reads_the_bundles_packages_and_says_how_to_add_the_running_kernels(
        monkeypatch, tmp_path):
    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()
    carried = "os/openeuler-24.03-aarch64/kernel-devel-6.6.0-112.0.0.104.oe2403.aarch64.rpm"
    (bundle_dir / MANIFEST).write_text(json.dumps({"files": {carried: "ab" * 32}}))
    config = SimpleNamespace(bundle_dir=str(bundle_dir))
    monkeypatch.setattr(context, "host_node_config", lambda _host: config)
    known = node_os("openEuler", "24.03")
    fake = node(OPENEULER)
    fake.facts.update({Arch: "aarch64", KernelHeaders: kernel_headers()})
    with on(fake):
        refusal = checks.kernel_headers_problem(config, known)
    assert refusal == (
        f"the running kernel {KERNEL}'s kernel-devel-{KERNEL} and kernel-headers-{KERNEL} are not in bundle "
        f"{bundle_dir}, and the driver builds against them; make the bundle again with `ascend-fleet bundle "
        f"INVENTORY --out {bundle_dir} --os 'openEuler 24.03' --kernel {KERNEL}` where the archive answers")
    (bundle_dir / MANIFEST).write_text(json.dumps({"files": {
        f"os/openeuler-24.03-aarch64/{name}-{KERNEL}.rpm": "ab" * 32 for name in ("kernel-devel", "kernel-headers")}}))
    with on(fake):
        assert checks.kernel_headers_problem(config, known) is None


def test_a_bundle_carries_the_headers_of_the_kernels_it_is_given_for_their_arch_only():
    known = node_os("openEuler", "24.03")
    kernels = [KERNEL, "6.6.0-28.0.0.34.oe2403.x86_64"]
    assert kernel_headers_packages(known, "aarch64", kernels) == [f"kernel-devel-{KERNEL}",
                                                                    f"kernel-headers-{KERNEL}"]
    assert kernel_headers_packages(node_os("Debian", "12"), "aarch64", kernels) == []


@pytest.mark.parametrize("kernel", ["6.6.0-28.0.0.34.oe2403", "6.6.0-28.0.0.34.oe2403.aarch64\n", "6.6.0 x.aarch64",
                                    "6.6.0-28;rm.aarch64", "6.6.0-28'.aarch64", "6.6.0-%d.aarch64", "--refresh",
                                    "6.6.0-28.0.0.34.oe2403.riscv64"])
def test_a_kernel_that_is_not_uname_r_with_an_arch_is_refused_in_one_line_before_any_download(kernel):
    """Without its arch the release would be left out of every arch's packages without a word; a blank, quote,
    ; or % would reach dnf's command line as a package name."""
    with pytest.raises(FleetError) as refused:
        kernel_releases([KERNEL, kernel])
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"bundle: --kernel {kernel!r}: expected a kernel release as")
    assert kernel_releases([KERNEL]) == [KERNEL]
