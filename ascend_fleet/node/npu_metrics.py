#!/usr/bin/env python3
"""NPU health and HBM use from `npu-smi info`, for node_exporter's textfile collector.

The monitoring stage installs this file on every worker and runs it from a systemd timer;
it writes <textfile dir>/ascend_npu.prom atomically. The controller imports it too
(`parse_npu_smi_info` is how the NpuStatus fact reads npu-smi), so it stays stdlib-only.

Why a timer and not an exporter that runs npu-smi at scrape time: npu-smi takes about a
second on a real 910B and hangs when the driver is wedged; here a hung npu-smi is killed
after a timeout and shows as `ascend_npu_smi_up 0`, and a dead timer as a stale file
(node_textfile_mtime_seconds), never as a scrape that times out.

Usage: npu_metrics.py TEXTFILE_DIR
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

NPU_ROW = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(OK|Warning|Alarm|Critical)\s*\|")
HBM_ROW = re.compile(r"(\d+)\s*/\s*(\d+)\s*\|\s*$")
# npu-smi's health words, worst last; the metric carries the index so alerts compare numbers.
HEALTH_CODES = {"OK": 0, "Warning": 1, "Alarm": 2, "Critical": 3}
FILE_NAME = "ascend_npu.prom"
NPU_SMI_TIMEOUT_SECONDS = 20
MIB = 1024 * 1024


def parse_npu_smi_info(lines: list[str]) -> list[dict]:
    """The NPU table of a successful `npu-smi info`: [{"id", "chip", "health", "hbm_used_mb", "hbm_total_mb"}]."""
    npus, current = [], None
    for line in lines:
        row = NPU_ROW.match(line)
        if row:
            current = {"id": int(row[1]), "chip": row[2], "health": row[3]}
            npus.append(current)
            continue
        hbm = HBM_ROW.search(line)
        if current is not None and "hbm_total_mb" not in current and hbm:
            current["hbm_used_mb"], current["hbm_total_mb"] = int(hbm[1]), int(hbm[2])
    return npus


def render_metrics(npu_smi_ok: bool, npus: list[dict]) -> str:
    """Prometheus text exposition of what npu-smi said."""
    lines = [
        "# HELP ascend_npu_smi_up Whether npu-smi info answered (0: driver not loaded, firmware mismatch, hung).",
        "# TYPE ascend_npu_smi_up gauge",
        f"ascend_npu_smi_up {int(npu_smi_ok)}",
        "# HELP ascend_npu_health NPU health as npu-smi reports it: 0 OK, 1 Warning, 2 Alarm, 3 Critical.",
        "# TYPE ascend_npu_health gauge",
        *(f'ascend_npu_health{{npu="{n["id"]}",chip="{n["chip"]}"}} {HEALTH_CODES[n["health"]]}' for n in npus),
        "# HELP ascend_npu_hbm_used_bytes HBM in use on the NPU.",
        "# TYPE ascend_npu_hbm_used_bytes gauge",
        *(f'ascend_npu_hbm_used_bytes{{npu="{n["id"]}"}} {n["hbm_used_mb"] * MIB}' for n in npus if "hbm_used_mb" in n),
        "# HELP ascend_npu_hbm_total_bytes HBM on the NPU.",
        "# TYPE ascend_npu_hbm_total_bytes gauge",
        *(f'ascend_npu_hbm_total_bytes{{npu="{n["id"]}"}} {n["hbm_total_mb"] * MIB}' for n in npus if "hbm_total_mb" in n),
    ]
    return "\n".join(lines) + "\n"


def read_npu_smi() -> tuple[bool, list[dict]]:
    try:
        result = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=NPU_SMI_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return False, []
    if result.returncode != 0:
        return False, []
    return True, parse_npu_smi_info(result.stdout.splitlines())


def write_atomically(directory: str, text: str) -> None:
    """node_exporter must never read a half-written file: write beside it, then rename."""
    fd, staged = tempfile.mkstemp(dir=directory, prefix=f".{FILE_NAME}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(staged, 0o644)
    os.replace(staged, os.path.join(directory, FILE_NAME))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} TEXTFILE_DIR", file=sys.stderr)
        return 2
    write_atomically(argv[1], render_metrics(*read_npu_smi()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
