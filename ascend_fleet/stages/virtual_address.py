"""Stage: the gateways' virtual address. keepalived on every gateway when the data gives gateway_vip
(ascend_fleet/fleet/virtual_address.py says how it moves and why), after nginx serves: its track script asks nginx.
Data without gateway_vip on a gateway that had one stops keepalived (the address goes with it) and
removes the config this stage wrote; the package stays."""

from __future__ import annotations

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.facts.files import FindInFile
from pyinfra.operations import files, systemd

from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.core.node_layout import KEEPALIVED_CONFIG, KEEPALIVED_NOTIFY_PROGRAM, VIRTUAL_ADDRESS_TEXTFILE
from ascend_fleet.fleet.virtual_address import KEEPALIVED_SERVICE, WRITTEN_BY, keepalived_config, notify_program
from ascend_fleet.operations import gates, placed
from ascend_fleet.operations.config import checked_config
from ascend_fleet.stages.context import host_os, os_packages


@deploy("Gateway virtual address")
def virtual_address_stage() -> None:
    gates.stage_begins(name="Stage: virtual address", stage="virtual_address")
    config = host_node_config(host)
    if not config.is_gateway:
        return
    if config.gateway_vip is None:
        if host.get_fact(FindInFile, path=KEEPALIVED_CONFIG, pattern=f"^{WRITTEN_BY}"):
            systemd.service(name="keepalived stopped (no gateway_vip)", service=KEEPALIVED_SERVICE, running=False,
                            enabled=False)
            files.file(name=f"No {KEEPALIVED_CONFIG}", path=KEEPALIVED_CONFIG, present=False)
            # else node_exporter would go on saying the gateway holds an address nobody has
            files.file(name=f"No {VIRTUAL_ADDRESS_TEXTFILE}", path=VIRTUAL_ADDRESS_TEXTFILE, present=False)
        return
    # Made now, while the deploy is prepared: a gateway whose address does not resolve changes no host.
    text = keepalived_config(config, inventory)
    os_packages("keepalived", list(host_os().virtual_address_packages))
    placed.file(name="keepalived's notify program (who holds the address, for node_exporter)",
                dest=KEEPALIVED_NOTIFY_PROGRAM, content=notify_program(config), mode="755")
    checked_config(name="keepalived config (keepalived -t, then reload)", dest=KEEPALIVED_CONFIG, content=text,
                   check=f"keepalived -t -f {KEEPALIVED_CONFIG}", service=KEEPALIVED_SERVICE,
                   what="keepalived config")
    systemd.service(name="keepalived at every boot", service=KEEPALIVED_SERVICE, running=True, enabled=True)
