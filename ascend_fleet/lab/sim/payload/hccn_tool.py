#!/usr/bin/python3 -S
"""hccn_tool for the lab's simulated NPUs: the NPU network commands a deploy makes, over real interfaces.

Each NPU's RoCE port is a real interface in the node's network namespace (hardware.json's
`npu_plane`: hccn<N>, bridged to the lab's parameter plane), so an address set here is a real
address, `-ping` sends real ICMP from that port, and `-link -g` reads its real carrier. Settings
go to /etc/hccn.conf as the real tool writes them (`address_N=`, `netmask_N=`, `gateway_N=`,
`netdetect_N=`); what the device itself holds (net-detect address, gateway, TLS switch) lives in
/run/ascend-sim/hccn, which a reboot empties, and the port's address in the namespace, which the
lab resets before each boot: the driver's boot activation runs `hccn_tool -a -cfg recovery`.

Output lines, error messages and exit codes follow Huawei's hccn_tool sources (main() returns the
error code: the exit status is its low byte); docs/sim-fidelity.md names each source and what is
the simulator's own.

A deploy runs it about 60 times a node, so its start is kept short: no site-packages (-S), port
state read from sysfs, and subprocess and ipaddress imported only by the commands that need them
(run, address_math): imports were half of a call.
"""

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ascend_sim as sim  # noqa: E402  (installed next to this script)

HCCN_CONF = "/etc/hccn.conf"
DEVICE_STATE_DIR = "/run/ascend-sim/hccn"
PING_COUNT = 3  # what the device sends (published transcripts: "3 packets transmitted")
FIRST_TABLE = 1000  # ascend_fleet.lab.network.npu_table

# Error codes (the tool's enum: UDA_MAJOR_CMD_ERR 0x1000, UDA_PARAM_ERR 0x2000, UDA_TOOL_ERR 0x3000,
# UDA_DSMI_ERR 0x4000, each member counting up from there) and the messages main() prints for them.
MAJOR_CMD_TYPE_ERR, MAJOR_CMD_NUM_ERR, MAJOR_CMD_INVALID_ERR, MAJOR_CMD_DEV_ID_ERR = 0x1001, 0x1002, 0x1003, 0x1004
PARAM_OP_NOT_SUPPORT_ERR, PARAM_CMD_COUNT_ERR, PARAM_IP_INVALID_ERR = 0x2003, 0x2004, 0x2006
PARAM_CONFLICT_IP_ADDR_ERR, PARAM_DIFF_SEGMT_GTWY_ERR, PARAM_TLS_INVALID_ENABLE_ERR = 0x2007, 0x2008, 0x2010
TOOL_USER_ABORT_CMD_ERR, TOOL_GATEWAY_NO_IP_CONF_ERR, TOOL_COFNIG_BROAD_ADDRESS_ERR = 0x3016, 0x301A, 0x3026
DSMI_EXE_ERR, DSMI_GATEWAY_NOT_PRESET_ERR, DSMI_IPCONF_NOT_PRESET_ERR = 0x4001, 0x4002, 0x400D

MORE = "Enter [ hccn_tool -h ] for more details."
MESSAGES = {
    MAJOR_CMD_TYPE_ERR: ['Get invalid major cmd type. The valid major cmd type should be "-a" or "-i".', MORE],
    MAJOR_CMD_NUM_ERR: ["Get invalid major cmd number. Please check your input.", MORE],
    MAJOR_CMD_INVALID_ERR: ["Get invalid major cmd.", MORE],
    MAJOR_CMD_DEV_ID_ERR: ["Get invalid device id."],
    PARAM_OP_NOT_SUPPORT_ERR: ["Get unknown option!"],
    PARAM_CMD_COUNT_ERR: ["The total count of input parameters is wrong!"],
    PARAM_IP_INVALID_ERR: ["The ip address you configured is invalid!"],
    PARAM_CONFLICT_IP_ADDR_ERR: ["The ip address configured is conflicted!"],
    PARAM_DIFF_SEGMT_GTWY_ERR: ["The segment of configured gateway doesn't match that of the configured ip adress!"],
    PARAM_TLS_INVALID_ENABLE_ERR: ["Get invalid enable value!"],
    TOOL_USER_ABORT_CMD_ERR: ["User aborts command."],
    TOOL_GATEWAY_NO_IP_CONF_ERR: ["Unable to configure gateway, because ip is not configured!"],
    TOOL_COFNIG_BROAD_ADDRESS_ERR: ["Can not config broadcast address!"],
    DSMI_EXE_ERR: ["Command execute failed!"],
    DSMI_GATEWAY_NOT_PRESET_ERR: ["Get gateway failed, because no gateway was preset there!"],
    DSMI_IPCONF_NOT_PRESET_ERR: ["Get ipconf failed, because no ip was preset there!"],
}
# Errors after which the real tool prints the command's parameter list (uda_cmd_pram_list_print).
WITH_PARAMETERS = {PARAM_OP_NOT_SUPPORT_ERR, PARAM_CMD_COUNT_ERR, PARAM_TLS_INVALID_ENABLE_ERR}
# Messages the real tool prints at INFO level, to stdout (the rest go to stderr).
INFO_LEVEL = {TOOL_USER_ABORT_CMD_ERR}
SUCCESS = "Cmd executed successfully!"
LINK_DOWN_WARNING = "[WARNING] This link down command will result in the loss of the IPv6 address, continue?"

# The real help table's entries for the commands the lab's tool has (IPv4 builds).
HELP = {
    "-ip": ("   [-s]                 : set ip cfg \n"
            "       address %s       : set IPv4 ip address, such as x.x.x.x\n"
            "       netmask %s       : set IPv4 ip netmask, such as x.x.x.x\n"
            "   [-g]                 : get ip address and netmask/prefix_length \n"),
    "-gateway": ("   [-s]                : set gateway cfg \n"
                 "       gateway %s      : set IPv4 gateway, such as x.x.x.x\n"
                 "   [-g]                : get gateway address \n"),
    "-netdetect": ("   [-s]                : set net detect cfg \n"
                   "       address %s      : set net detect IPv4 ip address, such as x.x.x.x\n"
                   "   [-g]                : get net detect cfg \n"),
    "-lldp": "   [-g]        : get lldp cfg \n",
    "-cfg": "   recovery    : recovery cfg \n   status      : config status \n",
    "-link": ("   [-s]                   : set the eth ports link status\n"
              "       down               : shut down eth port \n"
              "       up                 : start up eth port \n"
              "   [-g]                   : get the eth ports link status, UP or DOWN \n"),
    "-net_health": "   [-g]        : get net health status\n",
    "-tls": ("   [-s]        : set tls cfg\n"
             "       enable %d : set tls enable, 0: disable, 1: enable\n"
             "   [-g]        : get tls cfg\n"),
    "-ping": ("   [-g]                : get ping result\n"
              "       address %s      : set net detect IPv4 ip address, such as x.x.x.x\n"
              "      pkt %d           : ping cfg, the packet data length, [0 ~ 65507]\n"),
}
NET_HEALTH = {"ok": "Success", "timeout": "Receive timeout", "fault": "Fault", "init": "Init"}


class HccnError(Exception):
    """The tool fails with this code; out: what it printed before (a failed ping's lines)."""

    def __init__(self, code, out=()):
        super().__init__(code)
        self.code, self.out = code, list(out)


# --- the node's NPU ports --------------------------------------------------------------------

def run(argv):
    import subprocess
    return subprocess.run(argv, capture_output=True, text=True)


def address_math():
    import ipaddress
    return ipaddress


class Net:
    """The NPU ports as real interfaces in this network namespace (iproute2, iputils ping, sysfs)."""

    def ip(self, *args, check=True):
        result = run(["ip", *args])
        if check and result.returncode != 0:
            raise HccnError(DSMI_EXE_ERR)
        return result.stdout

    def sysfs(self, port, name):
        """/sys/class/net/<port>/<name>, or None (reading carrier of a port that is down fails)."""
        try:
            return Path("/sys/class/net", port, name).read_text().strip()
        except OSError:
            return None

    def address(self, port):
        """(address, prefix length) of the port, or None."""
        match = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/(\d+)", self.ip("-4", "-o", "addr", "show", "dev", port))
        return (match[1], int(match[2])) if match else None

    def set_address(self, port, address, prefix, table):
        network = address_math().IPv4Network(f"{address}/{prefix}", strict=False)
        self.ip("addr", "flush", "dev", port)
        self.ip("addr", "add", f"{address}/{prefix}", "dev", port)
        # Its own table and rule: answers from this address leave through this port (ascend_fleet.lab.network).
        self.ip("route", "flush", "table", str(table), check=False)
        self.ip("route", "add", str(network), "dev", port, "src", address, "table", str(table))
        while run(["ip", "rule", "del", "pref", str(table)]).returncode == 0:
            pass
        self.ip("rule", "add", "from", address, "table", str(table), "pref", str(table))

    def set_gateway(self, port, gateway, table):
        self.ip("route", "replace", "default", "via", gateway, "dev", port, "table", str(table))

    def carrier(self, port):
        return self.sysfs(port, "carrier") == "1"  # `ip link`'s LOWER_UP

    def set_admin(self, port, up):
        self.ip("link", "set", port, "up" if up else "down")

    def ping(self, port, address, count, size):
        """{seq (from 0): round-trip ms} of the replies to count echo requests sent from the port."""
        argv = ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "1", "-I", port, address]
        if size is not None:
            argv[1:1] = ["-s", str(size)]
        out = run(argv).stdout
        return {int(m[1]) - 1: float(m[2]) for m in re.finditer(r"icmp_seq=(\d+) ttl=\d+ time=([\d.]+) ms", out)}


# --- settings ---------------------------------------------------------------------------------

class Device:
    """NPU n: its port, the device-held settings (gone at reboot) and /etc/hccn.conf (kept)."""

    def __init__(self, node, net, npu, hardware):
        self.node, self.net, self.npu, self.hardware = node, net, npu, hardware
        plane = self.hardware.get("npu_plane") or {}
        ports, switch_ports = plane.get("interfaces", []), plane.get("switch_ports", [])
        self.port = ports[npu] if npu < len(ports) else None  # None: a lab without a parameter plane
        self.switch_port = switch_ports[npu] if npu < len(switch_ports) else None
        self.switch_address = plane.get("switch_address")
        self.table = FIRST_TABLE + npu

    # device-held state
    def _state_path(self):
        return self.node.path(DEVICE_STATE_DIR) / f"{self.npu}.json"

    def state(self):
        try:
            return json.loads(self._state_path().read_text())
        except FileNotFoundError:
            return {}

    def update_state(self, **values):
        path = self._state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**self.state(), **values}) + "\n")

    def tls(self):
        default = self.hardware.get("npu_tls", [])
        return self.state().get("tls", default[self.npu] if self.npu < len(default) else 0)

    # the port
    def require_port(self):
        if self.port is None:
            raise HccnError(DSMI_EXE_ERR)
        return self.port

    def address(self):
        return self.net.address(self.port) if self.port else None

    def link_up(self):
        return bool(self.port) and self.net.carrier(self.port)


def read_conf(node):
    return sim.read_key_values(node.path(HCCN_CONF))


def write_conf(node, npu, **values):
    """Set or drop (value None) `<key>_<npu>=` lines in /etc/hccn.conf, keeping the others in place."""
    path = node.path(HCCN_CONF)
    lines = path.read_text().splitlines() if path.exists() else []
    pending = {f"{key}_{npu}": value for key, value in values.items()}
    kept = []
    for line in lines:
        key = line.split("=", 1)[0]
        if key in pending:
            if pending[key] is not None:
                kept.append(f"{key}={pending.pop(key)}")
            else:
                pending.pop(key)
        else:
            kept.append(line)
    kept += [f"{key}={value}" for key, value in pending.items() if value is not None]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in kept))


def ipv4(text, code=PARAM_IP_INVALID_ERR):
    try:
        return address_math().IPv4Address(text)
    except ValueError:
        raise HccnError(code) from None


def prefix_of(netmask):
    try:
        return address_math().IPv4Network(f"0.0.0.0/{netmask}").prefixlen
    except ValueError:
        raise HccnError(PARAM_IP_INVALID_ERR) from None


# --- commands (each: (device, args) -> output lines) ------------------------------------------------

def pairs(args, allowed):
    values = dict(zip(args[::2], args[1::2]))
    if len(args) % 2 or set(values) - set(allowed):
        raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
    return values


def apply_address(dev, address, netmask, all_devices):
    prefix = prefix_of(netmask)
    ip = ipv4(address)
    network = address_math().IPv4Network(f"{ip}/{prefix}", strict=False)
    if ip in (network.network_address, network.broadcast_address) and prefix < 31:
        raise HccnError(PARAM_IP_INVALID_ERR)
    for other in all_devices:
        if other.npu != dev.npu and other.port and (other.address() or (None,))[0] == address:
            raise HccnError(PARAM_CONFLICT_IP_ADDR_ERR)
    dev.net.set_address(dev.require_port(), address, prefix, dev.table)


def apply_gateway(dev, gateway):
    dev.net.set_gateway(dev.require_port(), gateway, dev.table)
    dev.update_state(gateway=gateway)


def cmd_ip(dev, args, all_devices):
    if not args:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args[0] == "-s":
        if len(args) != 5:
            raise HccnError(PARAM_CMD_COUNT_ERR)
        values = pairs(args[1:], ("address", "netmask"))
        if set(values) != {"address", "netmask"}:
            raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
        apply_address(dev, values["address"], values["netmask"], all_devices)
        conf = read_conf(dev.node)
        gateway = conf.get(f"gateway_{dev.npu}")
        ipaddress = address_math()
        network = ipaddress.IPv4Network(f"{values['address']}/{values['netmask']}", strict=False)
        if gateway and ipaddress.IPv4Address(gateway) not in network:
            write_conf(dev.node, dev.npu, gateway=None)  # the real tool drops a gateway the new subnet leaves out
        elif gateway:
            apply_gateway(dev, gateway)
        write_conf(dev.node, dev.npu, address=values["address"], netmask=values["netmask"])
        return [SUCCESS]
    if args[0] == "-g":
        if len(args) != 1:
            raise HccnError(PARAM_CMD_COUNT_ERR)
        current = dev.address()
        if current is None:
            raise HccnError(DSMI_IPCONF_NOT_PRESET_ERR)
        address, prefix = current
        return [f"ipaddr:{address}", f"netmask:{address_math().IPv4Network(f'0.0.0.0/{prefix}').netmask}"]
    raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)


def cmd_gateway(dev, args, _all):
    if not args:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args[0] == "-s":
        if len(args) != 3:
            raise HccnError(PARAM_CMD_COUNT_ERR)
        gateway = str(ipv4(pairs(args[1:], ("gateway",))["gateway"]))
        current = dev.address()
        if current is None:
            raise HccnError(TOOL_GATEWAY_NO_IP_CONF_ERR)
        ipaddress = address_math()
        if ipaddress.IPv4Address(gateway) not in ipaddress.IPv4Network(f"{current[0]}/{current[1]}", strict=False):
            raise HccnError(PARAM_DIFF_SEGMT_GTWY_ERR)
        apply_gateway(dev, gateway)
        write_conf(dev.node, dev.npu, gateway=gateway)
        return [SUCCESS]
    if args[0] == "-g":
        gateway = dev.state().get("gateway")
        if not gateway:
            raise HccnError(DSMI_GATEWAY_NOT_PRESET_ERR)
        return [f"default gateway:{gateway}, Iface:eth{dev.npu}"]
    raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)


def cmd_netdetect(dev, args, _all):
    if not args:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args[0] == "-s":
        if len(args) != 3:
            raise HccnError(PARAM_CMD_COUNT_ERR)
        address = pairs(args[1:], ("address",))["address"]
        if ipv4(address) == address_math().IPv4Address("255.255.255.255"):
            raise HccnError(TOOL_COFNIG_BROAD_ADDRESS_ERR)
        dev.update_state(netdetect=address)
        write_conf(dev.node, dev.npu, netdetect=address)
        return [SUCCESS]
    if args[0] == "-g":
        if len(args) != 1:
            raise HccnError(PARAM_CMD_COUNT_ERR)
        return [f"netdetect addr: {dev.state().get('netdetect', '0.0.0.0')}"]
    raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)


def cmd_link(dev, args, _all):
    if not args:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args[0] == "-g":
        if len(args) != 1:
            raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
        return [f"link status: {'UP' if dev.link_up() else 'DOWN'}"]
    if args[0] == "-s":
        if len(args) != 2:
            raise HccnError(PARAM_CMD_COUNT_ERR if len(args) < 2 else PARAM_OP_NOT_SUPPORT_ERR)
        if args[1] == "down":
            print(LINK_DOWN_WARNING, flush=True)
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                raise HccnError(TOOL_USER_ABORT_CMD_ERR)
            dev.net.set_admin(dev.require_port(), False)
            return [SUCCESS]
        if args[1] == "up":
            dev.net.set_admin(dev.require_port(), True)
            recover(dev, [dev])  # the real tool runs its config recovery after a link up
            return [SUCCESS]
    raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)


def cmd_net_health(dev, args, _all):
    if args != ["-g"]:
        raise HccnError(PARAM_CMD_COUNT_ERR if len(args) != 1 else PARAM_OP_NOT_SUPPORT_ERR)
    netdetect = dev.state().get("netdetect")
    if not dev.link_up():
        status = "fault"
    elif not netdetect or dev.address() is None:
        status = "init"
    else:
        status = "ok" if dev.net.ping(dev.port, netdetect, 1, None) else "timeout"
    return [f"net health status: {NET_HEALTH[status]}"]


def cmd_lldp(dev, args, _all):
    if len(args) != 1:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args != ["-g"]:
        raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
    if not dev.link_up():
        raise HccnError(DSMI_EXE_ERR)  # no neighbour to report: the simulator's own choice
    indent = " " * 8
    return ["Chassis ID TLV", f"{indent}MAC: {switch_mac(dev)}", "Port ID TLV", f"{indent}Ifname: {dev.switch_port}",
            "System Description TLV", f"{indent}ascend-fleet lab parameter plane (Linux bridge)",
            "System Capabilities TLV", f"{indent}Enabled capabilities: Bridge",
            "Management Address TLV", f"{indent}IPv4: {dev.switch_address}",
            "Maximum Frame Size TLV", f"{indent}1500", "End of LLDPDU TLV"]


def switch_mac(dev):
    """A stable chassis MAC for the lab's switch (the bridge's own is not visible inside the node)."""
    digits = sum(map(ord, dev.switch_address or "")) % 256
    return f"02:af:00:00:00:{digits:02x}"


def cmd_tls(dev, args, _all):
    if not args:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args[0] == "-g":
        return [f"dev_id:{dev.npu}, tls switch[{dev.tls()}](0:disable, 1:enable), tls preconfigured[0]"
                f"(0:non-preset, 1:preset), tls alarm time threshold[60]days"]
    if args[0] == "-s" and len(args) == 3 and args[1] == "enable":
        if args[2] not in ("0", "1"):
            raise HccnError(PARAM_TLS_INVALID_ENABLE_ERR)
        dev.update_state(tls=int(args[2]))
        write_conf(dev.node, dev.npu, tls_enable=args[2])
        return [SUCCESS]
    raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)


def cmd_ping(dev, args, _all):
    if len(args) < 3 or len(args) > 5:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    if args[0] != "-g":
        raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
    values = pairs(args[1:], ("address", "pkt"))
    if "address" not in values:
        raise HccnError(PARAM_CMD_COUNT_ERR)
    address = str(ipv4(values["address"]))
    size = None
    if "pkt" in values:
        if not values["pkt"].isdigit() or int(values["pkt"]) > 65507:
            raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
        size = int(values["pkt"])
    replies = dev.net.ping(dev.require_port(), address, PING_COUNT, size) if dev.address() else {}
    lines = [f"device {dev.npu} PING {address}"]
    for seq in range(PING_COUNT):
        lines.append(f"recv seq={seq},time={replies[seq]:.6f}ms" if seq in replies else f"recv time out seq={seq}")
    received = sum(1 for seq in range(PING_COUNT) if seq in replies)
    lines.append(f"{PING_COUNT} packets transmitted, {received} received, "
                 f"{100 * (PING_COUNT - received) / PING_COUNT:.2f}% packet loss")
    if received < PING_COUNT:
        raise HccnError(DSMI_EXE_ERR, lines)  # the real tool fails when "recv time out seq" is in its output
    return lines


def cmd_cfg(dev, args, all_devices):
    if args != ["recovery"]:
        raise HccnError(PARAM_OP_NOT_SUPPORT_ERR)
    recover(dev, all_devices)
    return [SUCCESS]


def recover(dev, all_devices):
    """Re-apply NPU dev's lines of /etc/hccn.conf to the device (the real `-cfg recovery`)."""
    conf = read_conf(dev.node)
    n = dev.npu
    if dev.port and f"address_{n}" in conf and f"netmask_{n}" in conf:
        apply_address(dev, conf[f"address_{n}"], conf[f"netmask_{n}"], all_devices)
        if conf.get(f"gateway_{n}"):
            apply_gateway(dev, conf[f"gateway_{n}"])
    if conf.get(f"netdetect_{n}"):
        dev.update_state(netdetect=conf[f"netdetect_{n}"])
    if conf.get(f"tls_enable_{n}") in ("0", "1"):
        dev.update_state(tls=int(conf[f"tls_enable_{n}"]))


COMMANDS = {"-ip": cmd_ip, "-gateway": cmd_gateway, "-netdetect": cmd_netdetect, "-link": cmd_link,
            "-net_health": cmd_net_health, "-lldp": cmd_lldp, "-tls": cmd_tls, "-ping": cmd_ping, "-cfg": cmd_cfg}


# --- command line ----------------------------------------------------------------------------

def parameters(command):
    return [f"[ hccn_tool -i devid {command} ] needs the following parameters:", HELP[command]]


def help_text():
    lines = []
    for command, text in HELP.items():
        lines += [f"hccn_tool -i devid {command}", text]
    return lines + ["hccn_tool -a  -cfg", "    recovery   : recovery cfg \n"]


def devices(node, net):
    hardware = node.hardware()
    return [Device(node, net, n, hardware) for n in range(hardware["npu_count"])]


def execute(node, net, argv):
    """(stdout lines, stderr lines, exit status) of `hccn_tool <argv>`."""
    command = argv[2] if len(argv) > 2 else None
    try:
        if argv in (["-h"], ["--help"]):
            return help_text(), [], 0
        if not argv or len(argv) < 2:
            raise HccnError(MAJOR_CMD_NUM_ERR)
        if argv[0] == "-a":
            if argv[1:] != ["-cfg", "recovery"]:
                raise HccnError(MAJOR_CMD_INVALID_ERR)
            if not node.dcmi_initializes():
                raise HccnError(DSMI_EXE_ERR)
            everything = devices(node, net)
            for dev in everything:
                recover(dev, everything)
            return [SUCCESS], [], 0
        if argv[0] != "-i":
            raise HccnError(MAJOR_CMD_TYPE_ERR)
        if command not in COMMANDS:
            raise HccnError(MAJOR_CMD_INVALID_ERR)
        npu = argv[1]
        if not (npu.isdigit() and len(npu) <= 2) or not node.dcmi_initializes() \
                or int(npu) >= node.hardware()["npu_count"]:
            raise HccnError(MAJOR_CMD_DEV_ID_ERR)  # the device id is looked up through the driver
        everything = devices(node, net)
        return COMMANDS[command](everything[int(npu)], argv[3:], everything), [], 0
    except HccnError as error:
        out = error.out + (parameters(command) if error.code in WITH_PARAMETERS and command in HELP else [])
        message = MESSAGES[error.code]
        if error.code in INFO_LEVEL:
            return message + out, [], error.code & 0xFF
        return out, message, error.code & 0xFF


def main():
    out, err, code = execute(sim.Node(), Net(), sys.argv[1:])
    if out:
        sys.stdout.write("\n".join(out) + "\n")
    if err:
        sys.stderr.write("\n".join(err) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
