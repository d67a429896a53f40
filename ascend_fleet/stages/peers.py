"""Spreading a model's weights over the fleet: which peers a worker fetches from, and the
read-only nginx through which it serves its own verified files to them.

A worker spreads when its model's ``peers`` is true, or unset and more than one worker of the
inventory (``--limit`` or not) stages the same model revision. Every such worker serves its
model directory (templates/weights-peer-nginx.conf.j2) and its stager fetches each file from a
peer that holds a verified copy, else from the model's source (the origin).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import inventory
from pyinfra.api import deploy
from pyinfra.operations import apt, files

from ascend_fleet import TEMPLATES
from ascend_fleet.hostdata import NodeConfig, node_config
from ascend_fleet.operations.config import checked_config
from ascend_fleet.operations.files.stage_weights import PARTIAL_DIR_NAME, PEER_PUBLISHED_PATH, PEER_STAGING_PATH
from ascend_fleet.templating import render

WEIGHTS_SERVER_CONFIG = "/etc/nginx/conf.d/ascend-fleet-weights.conf"


@dataclass(frozen=True)
class Spread:
    """The other workers' weights servers, and where in the file list this one starts asking the
    origin (its place among the workers, so each asks the origin for different files first)."""

    peer_urls: list[str]
    origin_start: float


def fleet_spread(config: NodeConfig) -> Spread | None:
    """How this worker spreads its model over the fleet, or None when it fetches from the source alone."""
    model = config.model
    if model.peers is False or model.source == "rsync":
        return None
    members = {}
    for worker in inventory:  # every host, also those a --limit leaves out: they may hold the weights
        other = node_config(worker.data.dict(), worker.name)
        if other.is_worker and (other.model.id, other.model.revision) == (model.id, model.revision):
            address = worker.data.get("ssh_hostname") or worker.name
            members[worker.name] = f"http://{address}:{other.model.peer_port}"
    if len(members) < 2:
        return None
    names = sorted(members)
    return Spread([members[name] for name in names if name != config.host],
                  names.index(config.host) / len(names))


@deploy("Weights server for peers")
def weights_server(config: NodeConfig) -> None:
    """nginx serving this worker's published revisions and verified staging files, read-only."""
    apt.packages(name="Nginx", packages=["nginx-light"], no_recommends=True, update=True, cache_time=3600)
    files.link(name="No default site", path="/etc/nginx/sites-enabled/default", present=False)
    content = render(TEMPLATES / "weights-peer-nginx.conf.j2", port=config.model.peer_port,
                     model_dir=config.model_dir.rstrip("/"), partial=PARTIAL_DIR_NAME,
                     published=PEER_PUBLISHED_PATH, staging=PEER_STAGING_PATH)
    checked_config(name="Weights server config (nginx -t, then reload)", dest=WEIGHTS_SERVER_CONFIG,
                   content=content, check="nginx -t", service="nginx", what="weights server config")
