"""Stage: the firewall. On each worker and gateway, an nftables table of its own lets only the hosts
and networks that need them reach the fleet's ports (ascend_fleet/fleet/firewall.py says what and who): a
worker's instance, engine and peer ports, the exporters and Prometheus, VRRP between the gateways, SSH
where the data names who may; a unit loads it at boot.

On a release whose default firewall is firewalld (openEuler), firewalld is stopped and masked once
the table is loaded: its default zone rejects every port the fleet uses (instances, vLLM's and HCCL's
ranges, the peer port, node_exporter, the gateway's serving port), and keeping zones in step with this
table would be a second policy for the same ports. The node is then as a Debian one is: this table is
its policy for the fleet's ports. Preflight refuses a worker with instance_firewall: false while
firewalld runs."""

from __future__ import annotations

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import files, systemd

from ascend_fleet import TEMPLATES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.core.node_layout import CONFIG_DIR, FIREWALL_RULES_FILE, FIREWALL_UNIT, unit_file
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.firewall import FAMILY, TABLE, firewall_rules, host_openings
from ascend_fleet.operations import gates, placed, units
from ascend_fleet.operations.firewall import nft_table, nft_table_absent
from ascend_fleet.stages.context import host_os, os_packages
from ascend_fleet.stages.monitoring import NGINX_EXPORTER_PORT, NODE_EXPORTER_PORT, PROMETHEUS_PORT

UNIT_FILE = unit_file(FIREWALL_UNIT)


@deploy("Firewall")
def firewall_stage() -> None:
    gates.stage_begins(name="Stage: firewall", stage="firewall")
    config = host_node_config(host)
    if not (config.is_worker or config.is_gateway):
        return
    if not config.instance_firewall:
        if host.get_fact(File, path=UNIT_FILE):
            systemd.service(name="Firewall not loaded at boot", service=FIREWALL_UNIT, running=False,
                            enabled=False)
        removed = files.file(name=f"No unit {FIREWALL_UNIT}", path=UNIT_FILE, present=False)
        if removed.will_change:  # else systemd keeps the unit it loaded until its next reload
            systemd.daemon_reload(name="systemd forgets the firewall unit")
        nft_table_absent(name=f"No nftables table {FAMILY} {TABLE} (instance_firewall: false)",
                         path=FIREWALL_RULES_FILE, family=FAMILY, table=TABLE)
        return
    # Resolved now, while the deploy is prepared: a name that does not resolve changes no host.
    # node_exporter's port on every host (a closed port where none runs), Prometheus's and the exporter's on gateways.
    monitored = [NODE_EXPORTER_PORT, *((PROMETHEUS_PORT, NGINX_EXPORTER_PORT) if config.is_gateway else ())]
    rules = firewall_rules(host_openings(host, inventory, monitored))
    known = host_os()
    os_packages("nftables", [known.nftables])
    files.directory(name="ascend-fleet configuration", path=CONFIG_DIR, mode="755")
    nft_table(name="The fleet's ports for those that need them only (nft -c, then nft -f)",
              path=FIREWALL_RULES_FILE, rules=rules.text, family=FAMILY, table=TABLE, comment=rules.comment)
    unit = placed.file(name=f"Unit {FIREWALL_UNIT}", dest=UNIT_FILE, mode="644",
                       content=render(TEMPLATES / "instance-firewall.service.j2", family=FAMILY, table=TABLE,
                                      rules_file=FIREWALL_RULES_FILE))
    systemd.service(name="Firewall loaded at every boot", service=FIREWALL_UNIT, running=True, enabled=True,
                    daemon_reload=unit.will_change)
    if known.default_firewall:  # after the table is loaded: the node is never without a policy for its ports
        units.masked(name=f"{known.default_firewall} stopped and masked (this table is the fleet's policy)",
                     unit=f"{known.default_firewall}.service")
