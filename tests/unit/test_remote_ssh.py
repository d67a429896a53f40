"""The control machine's SSH outside a deploy (status, the rollout's gates, bench and tune tunnels): it
connects as pyinfra's deploys do, so an ssh config file, its ProxyJump through a bastion, its keys and known
hosts hold for every command. Real SSH servers on loopback (tests/sshserver.py) stand in for the nodes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from pyinfra.facts.server import Command

from ascend_fleet.core.remote import FactQuery, read_fleet_facts, run_script, ssh_tunnel
from tests.sshserver import LoopbackSSHServer, make_key

HELLO = {"hello": FactQuery(Command, {"command": "echo hello from $(id -un)"})}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A bastion and a worker behind it (two SSH servers), the login key, and an ssh config file that names
    them: `worker1` reached through `bastion` (ProxyJump), `direct` the worker's own port."""
    home = tmp_path_factory.mktemp("site")
    host_key, client_key = make_key(home / "host_key"), make_key(home / "id_ed25519")
    bastion, worker = LoopbackSSHServer(host_key, client_key), LoopbackSSHServer(host_key, client_key)
    (home / "known_hosts").write_text(bastion.known_hosts_line() + worker.known_hosts_line())
    common = (f"  HostName 127.0.0.1\n  IdentityFile {home / 'id_ed25519'}\n"
              f"  UserKnownHostsFile {home / 'known_hosts'}\n  StrictHostKeyChecking yes\n")
    (home / "config").write_text(f"Host bastion\n  Port {bastion.port}\n{common}"
                                 f"Host worker1\n  Port {worker.port}\n  ProxyJump bastion\n{common}"
                                 f"Host direct\n  Port {worker.port}\n{common}")
    yield {"config": str(home / "config"), "bastion": bastion, "worker": worker}
    bastion.close()
    worker.close()


def test_status_reads_a_host_the_ssh_config_file_maps_to_a_port(site):
    # The case: pyinfra followed the config and status said "Name or service not known".
    read = read_fleet_facts({"direct": ({"ssh_config_file": site["config"]}, HELLO)})["direct"]
    assert read.error is None and read.facts["hello"].startswith("hello from ")


def test_status_reads_a_worker_through_the_bastion_the_config_names(site):
    site["bastion"].asked.clear()
    site["worker"].asked.clear()
    read = read_fleet_facts({"worker1": ({"ssh_config_file": site["config"]}, HELLO)})["worker1"]
    assert read.error is None and read.facts["hello"].startswith("hello from ")
    # The bastion only forwarded to the worker's SSH port; the worker ran the facts.
    assert site["bastion"].asked == [f"forward 127.0.0.1:{site['worker'].port}"] and site["worker"].asked == ["exec"]


def test_a_script_runs_through_the_bastion_with_its_exit_status(site):
    done = run_script("worker1", {"ssh_config_file": site["config"]}, "echo out; echo err >&2; exit 3")
    assert (done.status, done.output) == (3, "out\n")


def test_an_unreachable_host_is_one_line_naming_it(site, tmp_path):
    config = tmp_path / "config"
    config.write_text(open(site["config"]).read().replace(f"Port {site['worker'].port}", "Port 1"))
    read = read_fleet_facts({"direct": ({"ssh_config_file": str(config)}, HELLO)})["direct"]
    assert read.error.startswith("cannot connect over SSH to direct:22: connection refused; check that the host")
    with pytest.raises(OSError, match=r"^cannot connect over SSH to direct:22: connection refused"):
        run_script("direct", {"ssh_config_file": str(config)}, "true")


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"instance says hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_instance_tunnel_goes_through_the_bastion(site):
    # bench --instance and tune reach an instance port the node's firewall keeps to loopback.
    instance = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=instance.serve_forever, daemon=True).start()
    try:
        with ssh_tunnel("worker1", {"ssh_config_file": site["config"]}, instance.server_address[1]) as port:
            answers = [requests.get(f"http://127.0.0.1:{port}/health", timeout=5).text for _ in range(3)]
        assert answers == ["instance says hello"] * 3
    finally:
        instance.shutdown()


def test_a_tunnel_to_a_port_nothing_serves_is_one_error(site):
    with socket_closed_port() as closed:
        with pytest.raises(OSError, match=rf"^ssh tunnel to worker1:{closed}: .*check that the instance runs"):
            with ssh_tunnel("worker1", {"ssh_config_file": site["config"]}, closed):
                pass


class socket_closed_port:
    """A loopback port nothing listens on (bound, then released)."""

    def __enter__(self) -> int:
        import socket
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    def __exit__(self, *exc) -> None:
        pass
