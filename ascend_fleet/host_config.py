"""A pyinfra host's validated config: its merged data (hostdata.node_config) with the instances of
the colour that serves, which the fleet state records (fleetstate.py) unless the data names one.
Host data's schema and validation (hostdata.py) read nothing but the data."""

from __future__ import annotations

from ascend_fleet.fleetstate import FleetState
from ascend_fleet.hostdata import NodeConfig, node_config
from ascend_fleet.per_run import once_per_run


def host_node_config(host, colour: str | None = None) -> NodeConfig:
    """NodeConfig of a pyinfra Host: host.data already merges inventory, group and all data. Its
    instances are those of `colour`, else of the data's `colour` (a swap starting the other set),
    else of the colour the fleet state records as serving.

    Validated once per pyinfra run: stages read every other host's config (peers, firewall, gateway,
    monitoring), which would otherwise cost the fleet size squared. Nothing a config is made from
    changes during a run (host data, the colours in the fleet state; a run writes only the served
    record, which no config reads); outside one (a rollout's own process, which records colours
    between its runs) nothing is kept."""
    run = getattr(host, "state", None)
    if run is None:
        return _host_node_config(host, colour)
    return once_per_run(run, ("host config", host.name, colour), lambda: _host_node_config(host, colour))


def _host_node_config(host, colour: str | None) -> NodeConfig:
    data = host.data.dict()
    if colour is None and "colour" not in data:
        state_dir = data.get("fleet_state_dir") or NodeConfig.model_fields["fleet_state_dir"].default
        colour = FleetState(state_dir).colour(host.name)
    return node_config({**data, "colour": colour} if colour else data, host.name)
