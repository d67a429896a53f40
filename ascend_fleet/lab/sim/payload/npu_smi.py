#!/usr/bin/python3 -S
"""npu-smi for the lab's simulated NPUs: the queries a deploy makes, in the real tool's output formats.

`npu-smi info`, `info -l`, `info -t board|usages|health -i <id>` and `-v`. Health comes from
/etc/ascend-lab/hardware.json; HBM use from the processes holding /dev/davinci<id> open, each
counting what it wrote to /run/ascend-sim/hbm/<id>/<pid> (MB; see docs/lab-contract.md).
"""

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ascend_sim as sim  # noqa: E402  (installed next to this script)

COLUMNS = (27, 15, 52)  # the 910B table's three column widths
INNER_WIDTH = sum(COLUMNS) + len(COLUMNS) - 1
# The driver and firmware hold ~3 GB of a 64 GB card, as idle 910B cards show in real output.
RESERVED_HBM_PER_MILLE = 47
BUS_NUMBERS = (0xC1, 0x81, 0x41, 0x01)  # 8-card Atlas A2 order: C1 81 41 01 C2 82 42 02
USAGE = """Usage: npu-smi info [-l | -t board|usages|health -i <id>]
       npu-smi -v"""


class UsageError(Exception):
    pass


# --- what the NPUs look like now ----------------------------------------------------

def bus_id(npu):
    return f"0000:{BUS_NUMBERS[npu % 4] + npu // 4:02X}:00.0"


def open_files(pid_dir):
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:  # exited, or not readable
        return set()
    targets = set()
    for fd in fds:
        try:
            targets.add(os.readlink(fd))
        except OSError:
            continue
    return targets


def device_holders(proc=Path("/proc")):
    """NPU index -> pids holding /dev/davinci<index> open."""
    holders = {}
    for pid_dir in proc.iterdir():
        if pid_dir.name.isdigit():
            for target in open_files(pid_dir):
                match = re.fullmatch(r"/dev/davinci(\d+)", target)
                if match:
                    holders.setdefault(int(match[1]), []).append(int(pid_dir.name))
    return holders


def advertised_mb(node, npu, pid):
    try:
        return max(0, int(node.hbm_advert_dir(npu).joinpath(str(pid)).read_text().strip()))
    except (FileNotFoundError, ValueError):
        return 0


def process_name(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "-"


def snapshot(node, holders):
    """Everything the queries print, from the running driver, the hardware file and the device holders."""
    loaded, hardware = node.loaded(), node.hardware()
    total = hardware["hbm_mb"]
    npus = []
    for npu in range(hardware["npu_count"]):
        processes = [(pid, process_name(pid), advertised_mb(node, npu, pid)) for pid in sorted(holders.get(npu, []))]
        used = min(total, total * RESERVED_HBM_PER_MILLE // 1000 + sum(mb for _, _, mb in processes))
        health = hardware["npu_health"][npu] if npu < len(hardware["npu_health"]) else "OK"
        npus.append({"id": npu, "chip": hardware["chip"], "health": health, "bus_id": bus_id(npu),
                     "power": round(88.0 + 0.7 * npu + 60.0 * used / total, 1),
                     "temp": 36 + npu % 3 + 10 * used // total,
                     "hbm_total": total, "hbm_used": used, "processes": processes,
                     "serial": f"1024{sum(map(ord, hardware['node'])):04d}{npu:04d}"})
    return {"driver": loaded["driver_version"], "firmware": loaded["firmware_version"], "npus": npus}


# --- output formats ------------------------------------------------------------------

def rule(fill):
    return "+" + "+".join(fill * width for width in COLUMNS) + "+"


def row(*cells):
    return "|" + "|".join(f" {cell}".ljust(width) for cell, width in zip(cells, COLUMNS)) + "|"


def wide_row(text):
    return "|" + f" {text}".ljust(INNER_WIDTH) + "|"


def render_info(snap):
    lines = ["+" + "-" * INNER_WIDTH + "+",
             wide_row(f"{'npu-smi ' + snap['driver']:<33}Version: {snap['driver']}"),
             rule("-"),
             row("NPU   Name", "Health", f"{'Power(W)':<12}{'Temp(C)':<18}Hugepages-Usage(page)"),
             row("Chip", "Bus-Id", f"{'AICore(%)':<12}{'Memory-Usage(MB)':<18}HBM-Usage(MB)"),
             rule("=")]
    for npu in snap["npus"]:
        lines += [row(f"{npu['id']:<6}{npu['chip']}", npu["health"],
                      f"{npu['power']:<12}{npu['temp']:<18}{0:<5}/ {0}"),
                  row("0", npu["bus_id"], f"{0:<12}{0:<5}/ {0:<11}{npu['hbm_used']:<5}/ {npu['hbm_total']}"),
                  rule("=")]
    lines += [rule("-"),
              row("NPU     Chip", "Process id", f"{'Process name':<25}| Process memory(MB)"),
              rule("=")]
    for npu in snap["npus"]:
        lines += [row(f"{npu['id']:<8}0", pid, f"{name:<25}| {mb}") for pid, name, mb in npu["processes"]]
        if not npu["processes"]:
            lines.append(wide_row(f"No running processes found in NPU {npu['id']}"))
        lines.append(rule("="))
    return "\n".join(lines) + "\n"


def key_values(pairs):
    """The `-t` and `-l` formats: indented `Key<padding>: value` lines, a blank line between blocks."""
    return "\n".join(" " * 8 + f"{key:<31}: {value}" if key else "" for key, value in pairs) + "\n"


def render_list(snap):
    pairs = [("Total Count", len(snap["npus"]))]
    for npu in snap["npus"]:
        pairs += [("", ""), ("NPU ID", npu["id"]), ("Chip Count", 1)]
    return key_values(pairs)


def render_board(snap, npu):
    return key_values([
        ("NPU ID", npu["id"]), ("Product Name", "NA"), ("Model", "NA"), ("Manufacturer", "Huawei"),
        ("Serial Number", npu["serial"]), ("Software Version", snap["driver"]),
        ("Firmware Version", snap["firmware"]), ("Compatibility", "OK"), ("Board ID", "0x65"),
        ("PCB ID", "A"), ("BOM ID", 1), ("PCIe Bus Info", npu["bus_id"]), ("Slot ID", npu["id"]),
        ("Class ID", "NA"), ("PCI Vendor ID", "0x19E5"), ("PCI Device ID", "0xD802"),
        ("Subsystem Vendor ID", "0x19E5"), ("Subsystem Device ID", "0x3003"), ("Chip Count", 1)])


def render_usages(snap, npu):
    return key_values([
        ("NPU ID", npu["id"]), ("Chip Count", 1), ("", ""),
        ("DDR Capacity(MB)", 0), ("DDR Usage Rate(%)", 0), ("DDR Hugepages Total(page)", 0),
        ("DDR Hugepages Usage Rate(%)", 0), ("HBM Capacity(MB)", npu["hbm_total"]),
        ("HBM Usage Rate(%)", 100 * npu["hbm_used"] // npu["hbm_total"]), ("Aicore Usage Rate(%)", 0),
        ("Aivector Usage Rate(%)", 0), ("Aicpu Usage Rate(%)", 0), ("Ctrlcpu Usage Rate(%)", 2),
        ("DDR Bandwidth Usage Rate(%)", 0), ("HBM Bandwidth Usage Rate(%)", 0), ("Chip ID", 0)])


def render_health(snap, npu):
    return key_values([("Health Status", npu["health"]), ("Error Code", "NA"), ("Error Information", "NA")])


DETAIL_TYPES = {"board": render_board, "usages": render_usages, "health": render_health}


# --- command line ----------------------------------------------------------------------

def parse_info_args(args):
    """`info` arguments -> (type or None, npu id or None, list flag)."""
    if args == ["-l"]:
        return None, None, True
    options = dict(zip(args[::2], args[1::2]))
    if len(args) % 2 or set(options) - {"-t", "-i", "-c"} or ("-t" in options) != ("-i" in options):
        raise UsageError(USAGE)
    if "-t" in options and options["-t"] not in DETAIL_TYPES:
        raise UsageError(f"The type {options['-t']} is not supported by the lab's npu-smi.\n{USAGE}")
    if "-i" in options and not options["-i"].isdigit():
        raise UsageError(f"Invalid card id {options['-i']}.")
    return options.get("-t"), int(options["-i"]) if "-i" in options else None, False


def run(node, argv):
    """(output, exit code) of `npu-smi <argv>`."""
    if argv == ["-v"]:
        driver = node.installed_driver()
        return f"npu-smi version: {driver['version']}\n", 0
    if not argv or argv[0] != "info":
        return USAGE + "\n", 1
    try:
        detail, npu_id, listing = parse_info_args(argv[1:])
    except UsageError as error:
        return f"{error}\n", 1
    if not node.dcmi_initializes():
        return sim.DCMI_INIT_FAILED + "\n", 1
    snap = snapshot(node, device_holders())
    if listing:
        return render_list(snap), 0
    if detail is None:
        return render_info(snap), 0
    if npu_id >= len(snap["npus"]):
        return f"Invalid card id {npu_id}. Use 'npu-smi info -l' to list the NPU IDs.\n", 1
    return DETAIL_TYPES[detail](snap, snap["npus"][npu_id]), 0


def main():
    output, code = run(sim.Node(), sys.argv[1:])
    sys.stdout.write(output)
    return code


if __name__ == "__main__":
    sys.exit(main())
