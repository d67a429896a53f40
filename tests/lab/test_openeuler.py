"""openEuler nodes before any deploy (issue 30 item 2), on a lab of its own (subnet N+6): worker1 on the lab's
openEuler 24.03 LTS flavour (Debian's real dnf and rpm against the lab's repository of stand-in RPMs,
firewalld active from boot, no apt or dpkg: docs/sim-fidelity.md, "openEuler lab node"), and worker2 on
Kylin V10, a release the product does not serve.

Each is only ever offered a full deploy that preflight must refuse before anything on it changes: Kylin for
its release, the openEuler node booted into a kernel whose headers no repository has. An openEuler worker's
deploy, rerun and serving are the users' site's (tests/lab/test_site.py).
"""

from __future__ import annotations

import os
import re

import pytest

from ascend_fleet.core.node_layout import SYSTEMD_STATE_ROOT
from ascend_fleet.lab.nodes import KERNEL_RELEASE_FILE
from tests.lab.conftest import brought_up, module_lab

pytestmark = [pytest.mark.lab, pytest.mark.part("session-lab")]  # placed to balance scripts/test's parts

OPENEULER, REFUSED = "worker1", "worker2"
ARCH = os.uname().machine
HARDWARE = f"nodes:\n  {OPENEULER}: {{os: openeuler-24.03}}\n  {REFUSED}: {{os: kylin-v10}}\n"
# Every file below these, with its type, size, mode, owner and mtime (and a digest under /etc): what a
# refused deploy must leave as it found it. systemd's own state holds the login's bookkeeping; lxcfs is
# the lab's mount (its mount point's time is lxcfs's); the rpm database's SQLite shared-memory file is
# written by every reader of the database (`rpm -q`).
SNAPSHOT = (f"find /etc /usr /opt {SYSTEMD_STATE_ROOT} /root /home -xdev \\( -path {SYSTEMD_STATE_ROOT}/systemd "
            f"-o -path {SYSTEMD_STATE_ROOT}/lxcfs -o -path {SYSTEMD_STATE_ROOT}/rpm/rpmdb.sqlite-shm \\) -prune "
            "-o -printf '%p %y %s %m %u %T@ %l\\n' | sort; "
            "find /etc -xdev -type f -exec sha256sum {} + | sort")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    hardware = tmp_path_factory.mktemp("openeuler") / "hardware.yaml"
    hardware.write_text(HARDWARE)
    yield from brought_up(module_lab("oe", "e", 6), 2, "--hardware", str(hardware))


@pytest.fixture(scope="module")
def refused(lab):
    """The Kylin worker's files before and after a full deploy offered to it alone, and that deploy's output."""
    before = lab.run(REFUSED, SNAPSHOT).stdout
    result = lab.pyinfra("deploys/full.py", "--limit", REFUSED, check=False)
    return {"before": before, "after": lab.run(REFUSED, SNAPSHOT).stdout, "result": result}


@pytest.fixture(scope="module")
def headless_kernel(lab):
    """The openEuler worker, before any deploy, booted into a kernel whose headers no repository of it has
    (the lab's simulated `uname -r`: docs/sim-fidelity.md, "The running kernel"): its files before and after a
    full deploy offered to it, and that deploy's output. Then it runs its own kernel again."""
    headless = f"6.6.0-1.0.0.1.oe2403.{ARCH}"  # no repository of the lab carries this kernel
    lab.run(OPENEULER, f"cp {KERNEL_RELEASE_FILE} /root/kernel-release && echo {headless} > {KERNEL_RELEASE_FILE}")
    try:
        before = lab.run(OPENEULER, SNAPSHOT).stdout
        result = lab.pyinfra("deploys/full.py", "--limit", OPENEULER, check=False)
        after = lab.run(OPENEULER, SNAPSHOT).stdout
    finally:
        lab.run(OPENEULER, f"cat /root/kernel-release > {KERNEL_RELEASE_FILE} && rm /root/kernel-release")
    return {"kernel": headless, "before": before, "after": after, "result": result}


def test_the_openeuler_node_is_openeulers_shape_before_any_deploy(lab):
    out = lab.run(OPENEULER, "grep -E '^(ID|VERSION_ID)=' /etc/os-release; cat /etc/system-release; "
                             "systemctl is-active firewalld; firewall-cmd --get-default-zone; "
                             "command -v apt-get dpkg || echo no-apt; rpm -q openEuler-release python3 firewalld; "
                             "python3 -m venv /tmp/venv && /tmp/venv/bin/python -V; "
                             "dnf -q repoquery --available --qf '%{name}-%{version}-%{release}' nginx").stdout
    assert 'ID="openEuler"\nVERSION_ID="24.03"\nopenEuler release 24.03 (LTS)\nactive\npublic\nno-apt\n' in out, out
    assert "Python 3.11" in out and "nginx-1.24.0-10.oe2403" in out, out
    assert "not installed" not in out, out


def test_a_node_whose_release_is_not_served_is_refused_at_preflight_in_one_line(refused):
    output = refused["result"].stdout
    assert refused["result"].returncode != 0, output[-3000:]
    lines = [line for line in output.splitlines() if REFUSED in line and re.search(r"kylin", line, re.I)]
    assert len(lines) == 1 and "V10" in lines[0], output[-3000:]
    assert "Stage: NPU driver" not in output, output[-3000:]


def test_a_refused_node_is_left_exactly_as_it_was(refused):
    before, after = refused["before"].splitlines(), refused["after"].splitlines()
    assert len(before) > 1000, before[:5]
    assert before == after, sorted(set(before) ^ set(after))[:40]


def test_a_node_whose_running_kernels_headers_no_repository_has_is_refused_at_preflight(headless_kernel):
    output, kernel = headless_kernel["result"].stdout, headless_kernel["kernel"]
    assert headless_kernel["result"].returncode != 0, output[-3000:]
    lines = [line for line in output.splitlines() if OPENEULER in line and f"kernel-devel-{kernel}" in line]
    assert len(lines) == 1 and "in none of its repositories" in lines[0], output[-3000:]
    assert "Stage: NPU driver" not in output, output[-3000:]
    before, after = headless_kernel["before"].splitlines(), headless_kernel["after"].splitlines()
    assert before == after, sorted(set(before) ^ set(after))[:40]
