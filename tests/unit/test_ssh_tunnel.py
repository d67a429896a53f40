"""The SSH tunnel bench and tune reach an instance through: its ssh command from the inventory's
data as pyinfra holds it, and one line when it cannot come up."""

from __future__ import annotations

import pytest
from pyinfra.api import Inventory

from ascend_fleet.remote import ssh_tunnel, tunnel_argv


def host_data(**data):
    inventory = Inventory(([("worker1", data)], {}))
    return next(iter(inventory)).data  # pyinfra's HostData: no [] access


def test_the_tunnel_uses_the_inventorys_ssh_settings():
    data = host_data(ssh_hostname="10.213.200.11", ssh_user="root", ssh_key="/lab/ssh/id_ed25519",
                     ssh_known_hosts_file="/lab/ssh/known_hosts", ssh_strict_host_key_checking="yes")
    argv = tunnel_argv("worker1", data, 40001, 8000)
    assert argv[:2] == ["ssh", "-N"] and argv[-1] == "root@10.213.200.11"
    assert "127.0.0.1:40001:127.0.0.1:8000" in argv and "StrictHostKeyChecking=yes" in argv
    assert "UserKnownHostsFile=/lab/ssh/known_hosts" in argv and argv[argv.index("-i") + 1] == "/lab/ssh/id_ed25519"
    assert tunnel_argv("worker2", host_data(), 40001, 8000)[-1] == "worker2"  # no data: the name, ssh's defaults


def test_a_tunnel_that_cannot_come_up_is_one_error():
    # Nothing listens on loopback port 1: ssh exits at once.
    with pytest.raises(OSError, match=r"ssh tunnel to worker1:8000 ended"):
        with ssh_tunnel("worker1", host_data(ssh_hostname="127.0.0.1", ssh_port=1), 8000):
            pass
