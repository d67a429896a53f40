"""The NPUs' own network (their RoCE ports, the parameter plane), set with the driver's hccn_tool.

.. code:: python

    from ascend_fleet.operations import hccn
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from pyinfra import host
from pyinfra.api import OperationValueError, operation

from ascend_fleet.config.hostdata import NpuNicSettings
from ascend_fleet.config.per_run import once_per_run
from ascend_fleet.facts.hccn import HCCN_TOOL, NpuNicConfig

# hccn_tool's set commands, in the order it accepts them: a gateway must lie in the address's segment.
SETTINGS = ("address", "gateway", "netdetect")


@operation()
def npu_nics(nics: Mapping[int, NpuNicSettings]):
    """
    Give each NPU's NIC its address and netmask, gateway and netdetect address where the NIC or
    /etc/hccn.conf (where hccn_tool keeps them over reboots) holds something else.

    + nics: NPU number -> its settings (``NodeConfig.npu_nic_settings()``); a gateway or netdetect
      address of None is left as the NIC has it

    Read back with ``hccn_tool -i N -ip -g`` (and ``-gateway -g``, ``-netdetect -g``), so a rerun
    changes nothing. An NPU whose settings match is not touched: setting an address restarts the
    port's link, which a serving multi-node instance would feel.

    **Example:**

    .. code:: python

        hccn.npu_nics(
            name="NPU NICs",
            nics={0: NpuNicSettings("10.20.0.11", "255.255.255.0", "10.20.0.254", "10.20.0.254")},
        )
    """
    if not nics or min(nics) < 0:
        raise OperationValueError(f"{host.name}: npu_nics: give settings for NPUs 0 and up, got {sorted(nics)}")
    current = host.get_fact(NpuNicConfig, npu_count=max(nics) + 1)
    commands = [command for npu, wanted in sorted(nics.items())
                for command in set_commands(npu, wanted, current.get(npu))]
    if not commands:
        readings_left_unchanged(host.state)[host.name] = current
        host.noop(f"the {len(nics)} NPU NICs have their addresses, gateways and netdetect addresses")
        return
    yield from commands


def readings_left_unchanged(state) -> dict[str, dict]:
    """NpuNicConfig as npu_nics read it on each host where it set nothing, for the checks right after
    it to take instead of asking hccn_tool the same again (three calls per NPU)."""
    return once_per_run(state, "NPU NIC readings left unchanged", dict)


def set_commands(npu: int, wanted: NpuNicSettings, now: dict | None) -> list[str]:
    """The hccn_tool commands that make one NPU's NIC, live and persisted, what is wanted."""
    now = now or {}
    persisted = now.get("persisted", {})
    live_and_kept = {
        "address": (now.get("address"), now.get("netmask"), persisted.get("address"), persisted.get("netmask")),
        "gateway": (now.get("gateway"), persisted.get("gateway")),
        "netdetect": (now.get("netdetect"), persisted.get("netdetect")),
    }
    wanted_as = {
        "address": (wanted.address, wanted.netmask) * 2,
        "gateway": (wanted.gateway,) * 2,
        "netdetect": (wanted.netdetect,) * 2,
    }
    arguments = {
        "address": f"-ip -s address {shlex.quote(wanted.address)} netmask {shlex.quote(wanted.netmask)}",
        "gateway": f"-gateway -s gateway {shlex.quote(wanted.gateway or '')}",
        "netdetect": f"-netdetect -s address {shlex.quote(wanted.netdetect or '')}",
    }
    return [f"{HCCN_TOOL} -i {npu} {arguments[setting]}" for setting in SETTINGS
            if wanted_as[setting][0] is not None and live_and_kept[setting] != wanted_as[setting]]
