"""Instances bigger than a node: the hosts of an inventory group serving one instance together with
vLLM data parallelism across nodes (vllm-ascend's multi-node guide, e.g. Qwen3.5-397B-A17B W8A8 on
two Atlas A2 nodes: TP8 per node, DP2 across them, expert parallel). The group's first host is the
head, which serves the API; the others run headless engines that join it.

Which host is which rank is a fleet question (group membership), so it is answered here from the
inventory's groups and every member's validated data, not from one host's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.core.errors import FleetError
from ascend_fleet.sizing.planner import PortRange

# What every member of one instance must have alike: they load one model and split one batch.
SHARED_KEYS = ("profile", "chip", "model", "serving", "tensor_parallel_size", "data_parallel", "npu_env")


@dataclass(frozen=True)
class DataParallelRole:
    """One host's part in a multi-node instance."""

    group: str
    head: str  # the head host's name
    head_address: str  # its serving_address: --data-parallel-address on every member
    start_rank: int  # --data-parallel-start-rank: the first DP rank this host runs
    size: int  # --data-parallel-size: every member's local ranks together
    size_local: int
    rpc_port: int
    api_server_count: int | None
    members: tuple[str, ...]  # in rank order, the head first

    @property
    def is_head(self) -> bool:
        return self.start_rank == 0

    def vllm_args(self) -> list[str]:
        """The data-parallel options of this host's `vllm serve`, as the guide gives them to each node."""
        args = ["--data-parallel-size", str(self.size), "--data-parallel-size-local", str(self.size_local),
                "--data-parallel-address", self.head_address, "--data-parallel-rpc-port", str(self.rpc_port)]
        if not self.is_head:
            return ["--headless", *args, "--data-parallel-start-rank", str(self.start_rank)]
        return args + (["--api-server-count", str(self.api_server_count)] if self.api_server_count else [])

    def head_ports(self) -> tuple[PortRange, ...]:
        """The ports the head takes for its engines besides its instance's own."""
        return head_ports(self.rpc_port)


def data_parallel_roles(groups: Mapping[str, list[str]], configs: list[NodeConfig]) -> dict[str, DataParallelRole]:
    """Host -> its role in the multi-node instance its data_parallel names; refuses the first of
    data_parallel_problems in one line."""
    problem = next(data_parallel_problems(groups, configs), None)
    if problem:
        raise FleetError(problem)
    return _roles(groups, configs)


def data_parallel_problems(groups: Mapping[str, list[str]], configs: list[NodeConfig]):
    """One line naming host and key per way the fleet's multi-node instances cannot work: a group that
    does not hold the host or holds it alone, a host in another instance's group, members that differ
    in what they serve, a head whose engine ports clash with its instance's."""
    by_host = {config.host: config for config in configs}
    named = {config.data_parallel.group for config in configs if config.data_parallel}
    for config in configs:
        spec = config.data_parallel
        elsewhere = sorted(group for group in named if config.host in groups.get(group, ()) and
                           (spec is None or group != spec.group))
        if elsewhere:
            yield (f"{config.host}: is in data_parallel group {elsewhere[0]} but its data names "
                   f"{spec.group if spec else 'no data_parallel'}; a host serves in one multi-node instance: remove "
                   f"it from {elsewhere[0]}, or give it that group's data")
        if spec is None:
            continue
        members = groups.get(spec.group, [])
        if config.host not in members:
            yield (f"{config.host}: data_parallel.group: {spec.group} is not an inventory group holding "
                   "this host; add the host to that group or name its group")
        elif len(members) < 2:
            yield (f"{config.host}: data_parallel.group: {spec.group} holds only this host; a multi-node "
                   "instance needs two or more (drop data_parallel to serve on one host)")
        elif members[0] in by_host:
            head = by_host[members[0]]
            for key in SHARED_KEYS:
                if getattr(config, key) != getattr(head, key):
                    yield (f"{config.host}: {key} differs from that of {head.host}, the head of data_parallel group "
                           f"{spec.group} (its first host in inventory order); every member of a multi-node "
                           "instance must serve alike")
                    break
    for group in sorted(named):
        members = groups.get(group, [])
        if len(members) > 1 and all(member in by_host for member in members):
            yield from _head_port_problems(by_host[members[0]], by_host[members[0]].data_parallel.rpc_port, group)


def _roles(groups: Mapping[str, list[str]], configs: list[NodeConfig]) -> dict[str, DataParallelRole]:
    by_host = {config.host: config for config in configs}
    roles = {}
    for config in configs:
        spec = config.data_parallel
        if spec is None:
            continue
        members = groups[spec.group]
        head = by_host[members[0]]
        rank = members.index(config.host)
        roles[config.host] = DataParallelRole(
            group=spec.group, head=head.host, head_address=str(head.serving_address),
            start_rank=rank * spec.size_local, size=len(members) * spec.size_local, size_local=spec.size_local,
            rpc_port=spec.rpc_port, api_server_count=spec.api_server_count, members=tuple(members))
    return roles


def head_ports(rpc_port: int) -> tuple[PortRange, ...]:
    """The ports a head takes for its engines besides its instance's own. Its DP master ports are
    among its instance's: vLLM 0.18.0 takes them upward from VLLM_PORT (VLLM_PORT_SPAN)."""
    return (PortRange("DP RPC port", "data_parallel.rpc_port", range(rpc_port, rpc_port + 1)),)


def _head_port_problems(head: NodeConfig, rpc_port: int, group: str):
    for taken in head_ports(rpc_port):
        for instance in head.instance_records():
            for claimed in instance.port_ranges():
                if taken.overlaps(claimed):
                    yield (f"{head.host}: the {taken} of multi-node instance {group} (head {head.host}) clashes "
                           f"with instance {instance.name}'s {claimed}; move {taken.field} or instance "
                           f"{instance.name}'s {claimed.field}")
        if head.model and head.model.peer_port in taken.ports:
            yield (f"{head.host}: the {taken} of multi-node instance {group} is model.peer_port "
                   f"{head.model.peer_port}, where peers fetch weights; move one of them")
