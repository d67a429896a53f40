"""Benchmark: a full deploy and its no-op rerun on labs of N workers + a gateway, as N grows.

Targets (issue 31): rerun / first deploy <= 0.10 at N = 3, and the rerun's seconds per extra host
flat (about the same at every N, measured against the smallest N). Each N gets a fresh lab of its
own (name, subnet, directory), taken down at the end, also when a run fails.

The control machine's own cost (issue 50): the CPU seconds the pyinfra process spends (its user and
system time with its children's, apart from the nodes', whose processes are not its children) on each
no-op rerun. On the largest lab, reruns limited to the gateway and the first k workers, k = 1..N, give
the CPU seconds per host as a least-squares line, projected to 1,000 hosts.

    sudo .venv/bin/python benchmarks/deploy_scale.py [--workers 3 6 12]

benchmarks/scale.py calls measure() for its deploy rows.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console

from ascend_fleet.core.errors import FleetError
from ascend_fleet.lab import lab
from ascend_fleet.lab.pyinfra_totals import totals
from ascend_fleet.lab.spec import DEFAULT_LAB_DIR, LabSpec
from ascend_fleet.operations.weights import DEFAULT_MIN_FREE_MARGIN_BYTES

PROJECT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
LAB_DIR = DEFAULT_LAB_DIR.parent / "deploy-scale"
LAB = {"name": "ds", "subnet": "10.213.170.0/24", "lab_dir": LAB_DIR, "profiles": ["lab"]}
TARGET_RATIO = 0.10
# NVMe disks just big enough for the lab's tiny model and the weights stage's free-space margin: the
# lab's default 8 GB each does not fit 12 workers on a machine with 70 GB free.
NVME_GB = math.ceil(DEFAULT_MIN_FREE_MARGIN_BYTES / 1024**3 + 2)


def timed_deploy(label: str, limit: list[str] | None = None) -> tuple[float, float, dict[str, int]]:
    """`pyinfra -y inventories/lab.py deploys/full.py` on the bench lab (`--limit` to those hosts): its
    seconds, the CPU seconds of pyinfra's process and its children, and its Grand total. The whole
    output of a run that fails is kept beside the lab directory."""
    limited = [option for host in limit or [] for option in ("--limit", host)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run([PYINFRA, "-y", *limited, "inventories/lab.py", "deploys/full.py"], cwd=PROJECT,
                            env={**os.environ, "ASCEND_FLEET_LAB_DIR": str(LAB_DIR)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if result.returncode != 0:
        log = LAB_DIR.with_name(f"{LAB_DIR.name}-{label}.log")
        log.write_text(result.stdout)
        raise FleetError(f"deploy_scale: the {label} deploy exited {result.returncode}; its output: {log}")
    return seconds, cpu, totals(result.stdout)


def require_no_op(counts: dict[str, int], what: str) -> None:
    """A no-op rerun runs every operation and changes none; else the benchmark stops, naming the run."""
    if counts["changed"] or counts["errors"] or not counts["operations"]:
        raise FleetError(f"deploy_scale: {what} ran {counts['operations']}, changed {counts['changed']} and "
                         f"failed {counts['errors']} operations; a no-op rerun must run them all and change none")


def control_cpu(workers: int, console: Console) -> dict:
    """On the deployed lab of `workers` workers and a gateway: a no-op rerun limited to the gateway and
    the first k workers for each k, its pyinfra CPU seconds, and their line per host."""
    points = []
    for k in range(1, workers + 1):
        hosts = ["gateway", *(f"worker{i}" for i in range(1, k + 1))]
        with console.status(f"N={workers}: no-op rerun of {len(hosts)} hosts"):
            _, cpu, counts = timed_deploy(f"limit-{k}", limit=hosts)
        require_no_op(counts, f"the rerun of {len(hosts)} hosts")
        points.append((len(hosts), cpu))
        console.print(f"  no-op rerun of {len(hosts):>2} hosts: pyinfra {cpu:5.2f} CPU s "
                      f"({counts['operations']} operations)")
    per_host, start = statistics.linear_regression(*zip(*points))
    return {"points": points, "start_cpu_s": start, "cpu_s_per_host": per_host,
            "cpu_s_1000_hosts": start + 1000 * per_host}


def measure_one(workers: int, console: Console, per_host: bool = False) -> dict:
    """A fresh lab of `workers` workers: the first deploy, then the rerun, which must change nothing
    (with `per_host`, then control_cpu's reruns)."""
    with tempfile.TemporaryDirectory(prefix="deploy-scale-") as scratch:
        hardware = Path(scratch) / "hardware.yaml"
        hardware.write_text(yaml.safe_dump({"defaults": {"nvme": {"size_gb": NVME_GB}}}))
        spec = LabSpec.build(workers, hardware, **LAB)
    lab.down(LAB_DIR)  # a previous run that crashed
    try:
        lab.up(spec, console)
        with console.status(f"N={workers}: first deploy"):
            first, _, _ = timed_deploy(f"first-{workers}")
        with console.status(f"N={workers}: no-op rerun"):
            rerun, rerun_cpu, counts = timed_deploy(f"rerun-{workers}")
        require_no_op(counts, f"N={workers}: the rerun")
        control = control_cpu(workers, console) if per_host else None
    finally:
        with console.status(f"N={workers}: taking the lab down"):
            lab.down(LAB_DIR)
    return {"workers": workers, "first_s": first, "rerun_s": rerun, "ratio": rerun / first,
            "rerun_cpu_s": rerun_cpu, "operations": counts["operations"], "control": control}


def measure(worker_counts: list[int], console: Console) -> list[dict]:
    """Each N's first deploy and rerun seconds, their ratio, and the rerun's seconds per host added
    since the smallest N (None at the smallest); each N's line printed as soon as it is measured."""
    rows: list[dict] = []
    largest = max(worker_counts)
    for workers in sorted(worker_counts):
        row = measure_one(workers, console, per_host=workers == largest)
        added = workers - rows[0]["workers"] if rows else 0
        row["rerun_s_per_extra_host"] = (row["rerun_s"] - rows[0]["rerun_s"]) / added if added else None
        rows.append(row)
        extra = (f"{row['rerun_s_per_extra_host']:5.2f}s per host beyond N={rows[0]['workers']}" if added
                 else "(the base)")
        console.print(f"N={workers:>2}: first deploy {row['first_s']:6.1f}s, rerun {row['rerun_s']:5.1f}s "
                      f"({row['operations']} operations, 0 changed; pyinfra {row['rerun_cpu_s']:.1f} CPU s), "
                      f"rerun/first {row['ratio']:.3f} (target <= {TARGET_RATIO}), rerun {extra}")
        if control := row["control"]:
            console.print(f"control machine, no-op rerun: {control['start_cpu_s']:.2f} CPU s of start-up and "
                          f"{control['cpu_s_per_host']:.3f} CPU s per host (least squares over "
                          f"{len(control['points'])} reruns of 2-{workers + 1} hosts): "
                          f"{control['cpu_s_1000_hosts']:.0f} CPU s for 1,000 hosts")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[3, 6, 12], help="lab sizes N (workers)")
    measure(parser.parse_args().workers, Console())


if __name__ == "__main__":
    main()
