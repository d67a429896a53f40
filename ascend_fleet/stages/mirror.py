"""The site mirror: the hosts of group `mirror` serve the site's bundle (bundle_dir) to the fleet with nginx.

A host of the site, not the control machine: the control machine may sit outside the fleet's network
(behind the bastion, an operator's laptop), and the nodes must reach the mirror at every deploy and
every restage. The gateway can be it (it runs nginx already). The fleet's data then names it:
pip_index_url http://MIRROR:PORT/simple, vendor_mirror_url http://MIRROR:PORT/files, model_mirror_url
http://MIRROR:PORT.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy

from ascend_fleet import TEMPLATES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import SITE_MIRROR_CONFIG, SITE_MIRROR_ROOT
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.os_repository import MIRROR_GROUP
from ascend_fleet.operations import bundle
from ascend_fleet.operations.config import checked_config
from ascend_fleet.stages.context import nginx_installed


def render_site_mirror_config(port: int, root: str = SITE_MIRROR_ROOT) -> str:
    return render(TEMPLATES / "site-mirror-nginx.conf.j2", port=port, root=root)


@deploy("Site mirror")
def mirror_stage() -> None:
    if MIRROR_GROUP not in host.groups:
        return
    config = host_node_config(host)
    if not config.bundle_dir:
        raise FleetError(f"{host.name}: in group {MIRROR_GROUP} without bundle_dir: give it the bundle it serves "
                         "(`ascend-fleet bundle`), or take it out of the group")
    # First the copy: with a bundle, this host's nginx comes from the copy's OS packages.
    bundle.served(name="The site's bundle", bundle=Path(config.bundle_dir), dest=SITE_MIRROR_ROOT)
    nginx_installed()
    checked_config(name="Site mirror config (nginx -t, then reload)", dest=SITE_MIRROR_CONFIG,
                   content=render_site_mirror_config(config.site_mirror_port), check="nginx -t", service="nginx",
                   what="site mirror config")
