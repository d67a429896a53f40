"""A pyinfra host's validated config: its merged data (hostdata.node_config) with the instances of
the colour that serves, which the fleet state records (fleetstate.py) unless the data names one.
Host data's schema and validation (hostdata.py) read nothing but the data and the profile it names,
which is read here once per run."""

from __future__ import annotations

from ascend_fleet.config.fleetstate import BLUE, FleetState
from ascend_fleet.config.hostdata import NodeConfig, node_config
from ascend_fleet.config.per_run import once_per_run, profile_of_the_run
from ascend_fleet.config.profile import load_profile


def host_node_config(host, colour: str | None = None) -> NodeConfig:
    """NodeConfig of a pyinfra Host: host.data already merges inventory, group and all data. Its
    instances are those of `colour`, else of the data's `colour` (a swap starting the other set),
    else of the colour the fleet state records as serving.

    Validated once per pyinfra run, or per loaded inventory in our own commands: stages and checks
    read every other host's config (peers, firewall, gateway, monitoring, the fleet's checks), which
    would otherwise cost the fleet size squared; the fleet state's colours are read once for all the
    hosts, not once per host (the file grows with the fleet). Nothing a config is made from changes
    while one run or one loaded inventory lasts (host data, the colours in the fleet state: a run
    writes only the served record, which no config reads; a rollout, which records colours between its
    runs, loads the inventory again after)."""
    scope = getattr(host, "state", None) or getattr(host, "inventory", None)
    if scope is None:
        return _host_node_config(host, colour, None)
    return once_per_run(scope, ("host config", host.name, colour), lambda: _host_node_config(host, colour, scope))


def _host_node_config(host, colour: str | None, scope) -> NodeConfig:
    data = host.data.dict()
    if colour is None and "colour" not in data:
        state_dir = str(data.get("fleet_state_dir") or NodeConfig.model_fields["fleet_state_dir"].default)
        colours = (FleetState(state_dir).colours() if scope is None
                   else once_per_run(scope, ("fleet colours", state_dir), FleetState(state_dir).colours))
        colour = colours.get(host.name, BLUE)
    return node_config({**data, "colour": colour} if colour else data, host.name,
                       load_profile if scope is None else lambda name: profile_of_the_run(scope, name))
