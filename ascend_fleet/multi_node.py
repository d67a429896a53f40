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

from ascend_fleet.errors import FleetError
from ascend_fleet.hostdata import NodeConfig
from ascend_fleet.planner import PortRange

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
        """The ports the head takes for its engines besides its instance's own. Its DP master ports are
        among its instance's: vLLM 0.18.0 takes them upward from VLLM_PORT (VLLM_PORT_SPAN)."""
        return (PortRange("DP RPC port", "data_parallel.rpc_port", range(self.rpc_port, self.rpc_port + 1)),)


def data_parallel_roles(groups: Mapping[str, list[str]], configs: list[NodeConfig]) -> dict[str, DataParallelRole]:
    """Host -> its role in the multi-node instance its data_parallel names; refuses, in one line naming
    host and key, a group that does not hold the host or holds it alone, members that differ in what
    they serve, and a head whose engine ports clash with its instance's."""
    by_host = {config.host: config for config in configs}
    roles = {}
    for config in configs:
        spec = config.data_parallel
        if spec is None:
            continue
        members = groups.get(spec.group, [])
        if config.host not in members:
            raise FleetError(f"{config.host}: data_parallel.group: {spec.group} is not an inventory group holding "
                             "this host; add the host to that group or name its group")
        if len(members) < 2:
            raise FleetError(f"{config.host}: data_parallel.group: {spec.group} holds only this host; a multi-node "
                             "instance needs two or more (drop data_parallel to serve on one host)")
        head = by_host[members[0]]
        for key in SHARED_KEYS:
            if getattr(by_host[member := config.host], key) != getattr(head, key):
                raise FleetError(f"{member}: {key} differs from that of {head.host}, the head of data_parallel group "
                                 f"{spec.group}; every member of a multi-node instance must serve alike")
        rank = members.index(config.host)
        roles[config.host] = DataParallelRole(
            group=spec.group, head=head.host, head_address=str(head.serving_address),
            start_rank=rank * spec.size_local, size=len(members) * spec.size_local, size_local=spec.size_local,
            rpc_port=spec.rpc_port, api_server_count=spec.api_server_count, members=tuple(members))
    for host, role in roles.items():
        if role.is_head:
            _check_head_ports(by_host[host], role)
    return roles


def _check_head_ports(head: NodeConfig, role: DataParallelRole) -> None:
    for taken in role.head_ports():
        for instance in head.instances:
            for claimed in instance.record().port_ranges():
                if taken.overlaps(claimed):
                    raise FleetError(
                        f"{head.host}: the {taken} of multi-node instance {role.group} (head {head.host}) clashes "
                        f"with instance {instance.name}'s {claimed}; move {taken.field} or instance {instance.name}'s "
                        f"{claimed.field}")
        if head.model and head.model.peer_port in taken.ports:
            raise FleetError(f"{head.host}: the {taken} of multi-node instance {role.group} is model.peer_port "
                             f"{head.model.peer_port}, where peers fetch weights; move one of them")
