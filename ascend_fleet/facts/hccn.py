"""Facts about the NPUs' own network (their RoCE ports, the "parameter plane" multi-node HCCL uses),
read with the driver's hccn_tool.

Each NPU's block of output starts with a `--- npu N` line and each answer with `[what]`, so one
SSH round trip reads every NPU. Output lines are hccn_tool's own (docs/sim-fidelity.md, hccn_tool).

.. code:: python

    from ascend_fleet.facts.hccn import NpuNicConfig, NpuNicHealth, NpuPings
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase
from typing_extensions import override

from ascend_fleet.facts.ascend import ASCEND_HOME

HCCN_TOOL = f"{ASCEND_HOME}/driver/tools/hccn_tool"
HCCN_CONF = "/etc/hccn.conf"  # where hccn_tool keeps each NPU's settings: address_N=, netmask_N=, ...
NPU_MARKER = "--- npu "
IPV4 = r"(\d{1,3}(?:\.\d{1,3}){3})"
# `hccn_tool -i N -ip -g` when set; unset, it says "Get ipconf failed, because no ip was preset there!".
IPADDR = re.compile(rf"^ipaddr\s*:\s*{IPV4}")
NETMASK = re.compile(rf"^netmask\s*:\s*{IPV4}")
LINK = re.compile(r"^link status\s*:\s*(\S+)", re.IGNORECASE)
NET_HEALTH = re.compile(r"^net health status\s*:\s*(.+?)\s*$", re.IGNORECASE)
LLDP_NEIGHBOUR = re.compile(r"Ifname\s*:\s*(\S+)")
TLS_SWITCH = re.compile(r"tls switch\[(\d)\]")
PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


def hccn_script(npus: range, *questions: tuple[str, str]) -> str:
    """A shell loop asking hccn_tool each (tag, arguments) for every NPU; exits 0 whatever it finds (a
    failing fact command would fail the host), and prints nothing without hccn_tool."""
    asks = "; ".join(f"echo '[{tag}]'; {HCCN_TOOL} -i $i {arguments} 2>&1" for tag, arguments in questions)
    return (f"[ -x {HCCN_TOOL} ] || exit 0; for i in {' '.join(map(str, npus))}; do "
            f"echo '{NPU_MARKER}'$i; {asks}; done; true")


def answers_by_npu(lines: list[str]) -> dict[int, dict[str, list[str]]]:
    """{npu: {tag: [its output lines]}} from hccn_script's output."""
    answers: dict[int, dict[str, list[str]]] = {}
    current: list[str] = []
    for line in lines:
        if line.startswith(NPU_MARKER):
            npu = int(line[len(NPU_MARKER):])
            answers[npu] = {}
        elif re.fullmatch(r"\[[a-z_]+\]", line) and answers:
            current = answers[npu].setdefault(line[1:-1], [])
        elif answers:
            current.append(line)
    return answers


def first_match(pattern: re.Pattern, lines: list[str]) -> str | None:
    for line in lines:
        if match := pattern.search(line.strip()):
            return match.group(1)
    return None


def any_address(lines: list[str]) -> str | None:
    """The address a `-gateway -g` (`default gateway:G, Iface:ethN`) or `-netdetect -g`
    (`netdetect addr: D` in Huawei's source, `netdetect address: D` in real A2 transcripts) answer
    holds; None when it holds none, or 0.0.0.0 (never set)."""
    address = first_match(re.compile(IPV4), lines)
    return None if address == "0.0.0.0" else address


class NpuNicConfig(FactBase[dict]):
    """
    What each NPU's NIC is set to now (`hccn_tool -i N -ip -g`, `-gateway -g`, `-netdetect -g`), and
    what /etc/hccn.conf keeps for it:

    .. code:: python

        {0: {"address": "10.20.0.11", "netmask": "255.255.255.0", "gateway": "10.20.0.254",
             "netdetect": "10.20.0.254",
             "persisted": {"address": "10.20.0.11", "netmask": "255.255.255.0", ...}}, ...}

    A setting not made is None (and absent from "persisted"). ``{}`` when the node has no hccn_tool
    (no NPU driver yet).
    """

    @override
    def command(self, npu_count: int) -> str:
        return (hccn_script(range(npu_count), ("ip", "-ip -g"), ("gateway", "-gateway -g"),
                            ("netdetect", "-netdetect -g"))
                + f"; echo '{NPU_MARKER}conf'; cat {HCCN_CONF} 2>/dev/null; true")

    @override
    def process(self, output) -> dict:
        lines = list(output)
        conf_at = lines.index(f"{NPU_MARKER}conf") if f"{NPU_MARKER}conf" in lines else len(lines)
        persisted = persisted_settings(lines[conf_at + 1:])
        return {npu: {"address": first_match(IPADDR, answer.get("ip", [])),
                      "netmask": first_match(NETMASK, answer.get("ip", [])),
                      "gateway": any_address(answer.get("gateway", [])),
                      "netdetect": any_address(answer.get("netdetect", [])),
                      "persisted": persisted.get(npu, {})}
                for npu, answer in answers_by_npu(lines[:conf_at]).items()}

    @override
    def default(self) -> dict:
        return {}


def persisted_settings(lines: list[str]) -> dict[int, dict[str, str]]:
    """/etc/hccn.conf's `address_0=10.20.0.11` lines as {0: {"address": "10.20.0.11"}}."""
    settings: dict[int, dict[str, str]] = {}
    for line in lines:
        match = re.fullmatch(r"\s*(address|netmask|gateway|netdetect)_(\d+)\s*=\s*(\S+)\s*", line)
        if match:
            settings.setdefault(int(match.group(2)), {})[match.group(1)] = match.group(3)
    return settings


class NpuNicHealth(FactBase[dict]):
    """
    Each NPU NIC's state by vllm-ascend's multi-node checklist: its link (`-link -g`), its net health
    (`-net_health -g`: the netdetect address answers), its switch-side neighbour (`-lldp -g`) and its
    TLS switch (`-tls -g`):

    .. code:: python

        {0: {"link": "UP", "net_health": "Success", "neighbour": "100GE1/0/1", "tls": 0}, ...}

    A value hccn_tool did not give is None; its answer is kept whole under "said" for the error line.
    ``{}`` when the node has no hccn_tool.
    """

    @override
    def command(self, npu_count: int) -> str:
        return hccn_script(range(npu_count), ("link", "-link -g"), ("net_health", "-net_health -g"),
                           ("lldp", "-lldp -g"), ("tls", "-tls -g"))

    @override
    def process(self, output) -> dict:
        health = {}
        for npu, answer in answers_by_npu(list(output)).items():
            tls = first_match(TLS_SWITCH, answer.get("tls", []))
            health[npu] = {
                "link": first_match(LINK, answer.get("link", [])),
                "net_health": first_match(NET_HEALTH, answer.get("net_health", [])),
                "neighbour": first_match(LLDP_NEIGHBOUR, answer.get("lldp", [])),
                "tls": int(tls) if tls is not None else None,
                "said": {tag: " ".join(line.strip() for line in said if line.strip()) for tag, said in answer.items()},
            }
        return health

    @override
    def default(self) -> dict:
        return {}


class NpuPings(FactBase[dict]):
    """
    Whether each NPU reaches addresses on the parameter plane (`hccn_tool -i N -ping -g address A`),
    all pings at once:

    .. code:: python

        {(0, "10.20.0.21"): {"sent": 3, "received": 3, "said": "3 packets transmitted, 3 received, ..."}, ...}

    sent and received are None when hccn_tool printed no summary (it could not ping).
    """

    @override
    def command(self, targets: list[tuple[int, str]]) -> str:
        if not targets:
            return "true"
        pings = " ".join(
            f"( out=$({HCCN_TOOL} -i {npu} -ping -g address {shlex.quote(address)} 2>&1); "
            f"printf '%s\\n' {shlex.quote(f'{NPU_MARKER}{npu} {address}')} \"$out\" ) > $dir/{n} &"
            for n, (npu, address) in enumerate(targets))
        return (f"[ -x {HCCN_TOOL} ] || exit 0; dir=$(mktemp -d); {pings} wait; "
                f"cat $dir/*; rm -rf $dir; true")

    @override
    def process(self, output) -> dict:
        pings, said = {}, []
        for line in [*output, NPU_MARKER]:
            if line.startswith(NPU_MARKER):
                if said:
                    npu, address = said[0][len(NPU_MARKER):].split()
                    summary = first_match(re.compile(r"(\d+ packets transmitted, \d+ received.*)"), said[1:])
                    counts = PING_SUMMARY.search(summary) if summary else None
                    pings[(int(npu), address)] = {
                        "sent": int(counts.group(1)) if counts else None,
                        "received": int(counts.group(2)) if counts else None,
                        "said": summary or " ".join(line.strip() for line in said[1:] if line.strip()),
                    }
                said = [line]
            else:
                said.append(line)
        return pings

    @override
    def default(self) -> dict:
        return {}
