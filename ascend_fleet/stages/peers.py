"""Spreading a model's weights and the profile's vendor packages over the fleet: which peers a
worker fetches from, and the read-only nginx through which it serves its own verified files to them.

A worker spreads its weights when its model's ``peers`` is true, or unset and more than one worker
of the inventory (``--limit`` or not) stages the same model revision. Every such worker serves its
model directory (templates/weights-peer-nginx.conf.j2) and its stager fetches each file from a
peer that holds a verified copy, else from the model's source (the origin).

Vendor packages follow the same rule (more than one worker of the inventory needs the package,
off with ``peers: false``): each worker serves its package directory, and one worker of the run,
the package's seeder, fetches it (from a peer, else the origin) before the others ask the peers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host, inventory, state
from pyinfra.api import deploy
from pyinfra.facts.server import Arch

from ascend_fleet import TEMPLATES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.per_run import fact_of_the_run, once_per_run, profile_of_the_run
from ascend_fleet.core.node_layout import PACKAGE_DIR, PEER_SERVER_CONFIG, PEER_SERVER_LOG, WHEEL_DIR
from ascend_fleet.core.templating import render
from ascend_fleet.node.peer_wheels import PEER_WHEELS_PATH
from ascend_fleet.node.stage_weights import (
    INCOMING_DIR_NAME,
    PARTIAL_DIR_NAME,
    PEER_PUBLISHED_PATH,
    PEER_RECEIVING_PATH,
    PEER_STAGING_PATH,
)
from ascend_fleet.operations.config import checked_config
from ascend_fleet.operations.vendor import PEER_PACKAGES_PATH
from ascend_fleet.stages.context import nginx_installed

# Workers of the run that ask the origin for the model, each for its share: the others take it from
# peers (node/stage_weights/spread.py says why not every worker). bench-weights, ratio of all
# workers' time to one's, at 6 and 12 workers: every worker a seeder 1.17-1.22 and 1.51-1.57;
# 2 seeders 1.30-1.31 and 1.36-1.41 (only their links carried new files); 4 1.22 and 1.29; 6 at 12
# 1.31; with files taken as they arrive at a peer, 4 1.17-1.19 and 1.27, 6 1.18 and 1.26 (2 at 6:
# 1.29); and relay trees, 4 1.17-1.19 and 1.24-1.28. More than one, so that the death of one does
# not stop the origin for PROGRESS_SECONDS.
ORIGIN_SEEDERS = 4
# Weights files a worker's peer server sends at once (templates/weights-peer-nginx.conf.j2 says why).
# bench-weights, 12 workers, two seeders: unbounded, every worker fetched each new file from its one
# holder at once and the seeders' links carried the fleet's download (ratio 3.66); 2 at once 1.53,
# 3 1.37 and 1.39, 4 1.36 (BitTorrent's default of upload slots is 4 as well).
PEER_UPLOADS = 4


@dataclass(frozen=True)
class Spread:
    """The other workers' weights servers, where in the file list this one starts asking the
    origin if it must (its place among the workers, so each asks for different files first), the
    other seeders' servers, and whether this worker is a seeder."""

    peer_urls: list[str]
    origin_start: float
    seeder_urls: list[str]
    seeding: bool


def fleet_spread(config: NodeConfig) -> Spread | None:
    """How this worker spreads its model over the fleet, or None when it fetches from the source alone.
    The seeders are the first ORIGIN_SEEDERS of the run's workers that stage the model, by name."""
    model = config.model
    if model.peers is False or model.source == "rsync":
        return None
    members, seeders = once_per_run(host.state, ("weights spread", model.id, model.revision),
                                    lambda: weights_members(model.id, model.revision))
    if len(members) < 2:
        return None
    names = sorted(members)
    return Spread([members[name] for name in names if name != config.host], names.index(config.host) / len(names),
                  [members[name] for name in seeders if name != config.host], config.host in seeders)


def weights_members(model_id: str, revision: str) -> tuple[dict[str, str], list[str]]:
    """The workers that serve this revision (name -> peer server URL), every host of the inventory
    (also those a --limit leaves out: they may hold the weights), and the run's seeders among them.
    Read once a run: each worker's own walk of the inventory made a fleet's deploy quadratic."""
    members, in_run = {}, []
    for worker in inventory:
        other = host_node_config(worker)
        if other.is_worker and (other.model.id, other.model.revision) == (model_id, revision):
            members[worker.name] = peer_server_url(worker, other)
            if worker in state.activated_hosts:
                in_run.append(worker.name)
    return members, sorted(in_run)[:ORIGIN_SEEDERS]


def peer_server_url(worker, config: NodeConfig) -> str:
    """Where a worker's peer server answers the fleet."""
    return f"http://{worker.data.get('ssh_hostname') or worker.name}:{config.model.peer_port}"


@dataclass(frozen=True)
class PackageSpread:
    """Where one worker takes one vendor package: the seeder (the first worker of the run that needs
    it) fetches it before everyone else; every worker asks peer_urls, in order, before the origin."""

    seeder: str
    peer_urls: list[str]


def package_spread(host_name: str, holders: dict[str, str], in_run: set[str]) -> PackageSpread | None:
    """How host_name takes a package that the workers `holders` (name -> peer server URL) need, of
    which `in_run` run now; None when it is alone. The seeder is asked first (it holds the package by
    the time the others fetch), then the other workers from this one's place on, so that a fleet
    whose seeder is gone does not queue on one peer."""
    if host_name not in holders or len(holders) < 2:
        return None
    seeder = min(name for name in holders if name in in_run)
    names = sorted(holders)
    place = names.index(host_name)
    others = [name for name in names[place + 1:] + names[:place] if name != seeder]
    order = others if host_name == seeder else [seeder, *others]
    return PackageSpread(seeder, [holders[name] for name in order])


def package_servers() -> dict[str, tuple[str, frozenset[str]]]:
    """Workers of the inventory (also those a --limit leaves out) that spread packages: name -> their
    peer server's URL and the artifacts their profile has on their architecture (package files, the
    stack's wheels). Read once a run."""
    return once_per_run(host.state, "package servers", read_package_servers)


def read_package_servers() -> dict[str, tuple[str, frozenset[str]]]:
    servers = {}
    for worker in inventory:
        config = host_node_config(worker)
        if not config.is_worker or config.model.peers is False:
            continue
        profile = profile_of_the_run(state, config.profile)
        # A worker in this run says its architecture; one a --limit leaves out may hold the files of
        # any architecture its profile has.
        arches = [fact_of_the_run(worker, Arch)] if worker in state.activated_hosts else profile.arch
        artifacts = {name for arch in arches for name in profile.vendor_files(arch).values()}
        artifacts |= {wheels_of(config.profile, arch) for arch in arches}
        servers[worker.name] = (peer_server_url(worker, config), frozenset(artifacts))
    return servers


def wheels_of(profile_name: str, arch: str) -> str:
    """The artifact a profile's Python stack is on one architecture (its wheels spread as one)."""
    return f"wheels of {profile_name} on {arch}"


def spread_of_package(host_name: str, artifact: str) -> PackageSpread | None:
    """How this worker takes an artifact (a vendor package's file name, or wheels_of) over the fleet,
    or None when it fetches it alone."""
    holders = {name: url for name, (url, artifacts) in package_servers().items() if artifact in artifacts}
    return package_spread(host_name, holders, {worker.name for worker in state.activated_hosts})


def peer_server(config: NodeConfig) -> None:
    """nginx serving this worker's published revisions, verified staging files and verified vendor
    packages to the fleet, read-only: put in place by the first stage of the run that spreads
    something (vendor packages, wheels, weights); the later ones find it there."""
    in_place = once_per_run(host.state, "peer servers", set)
    if host.name not in in_place:
        in_place.add(host.name)
        peer_server_in_place(config)


@deploy("Peer server")
def peer_server_in_place(config: NodeConfig) -> None:
    nginx_installed()
    content = render_peer_server_config(config.model.peer_port, config.model_dir)
    checked_config(name="Peer server config (nginx -t, then reload)", dest=PEER_SERVER_CONFIG,
                   content=content, check="nginx -t", service="nginx", what="peer server config")


def render_peer_server_config(port: int, model_dir: str, access_log: str = PEER_SERVER_LOG) -> str:
    return render(TEMPLATES / "weights-peer-nginx.conf.j2", port=port, model_dir=model_dir.rstrip("/"),
                  partial=PARTIAL_DIR_NAME, published=PEER_PUBLISHED_PATH, staging=PEER_STAGING_PATH,
                  receiving=PEER_RECEIVING_PATH, incoming=INCOMING_DIR_NAME,
                  packages=PEER_PACKAGES_PATH, package_dir=PACKAGE_DIR, wheels=PEER_WHEELS_PATH, wheel_dir=WHEEL_DIR,
                  access_log=access_log, uploads=PEER_UPLOADS)
