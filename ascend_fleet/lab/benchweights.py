"""`ascend-fleet lab bench-weights`: how long a model takes to reach one node, then every node,
when every link (each node's, both ways, and the origin's) runs at the same rate.

In a lab of its own (own name, subnet and directory, journalled in the lab state of
``--lab-dir`` so that `lab down` there removes it too), on the lab mirror as the origin: a
synthetic model of the given size in many shards, staged by the real weights deploy
(`pyinfra inventories/lab.py deploys/weights.py`) three times, each from empty disks:

    one     one worker, its peers empty: every file from the origin
    peers   every worker at once, spreading over the fleet (model.peers)
    origin  every worker at once, each from the origin alone (model.peers false)

Times are the slowest stager's own (from its start to its rename into place, as it prints
them); pyinfra's wall time is shown beside them. peers/one is the `ratio` (target: at most
1.5 with 6 workers); origin/one shows what the fleet would pay without peers (about N).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from rich.console import Console

from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.model_tree import publish_model
from ascend_fleet.core.node_layout import PEER_SERVER_LOG
from ascend_fleet.lab import lab
from ascend_fleet.lab.host import run
from ascend_fleet.lab.mirror import mirror_root
from ascend_fleet.lab.shaping import limit_links
from ascend_fleet.lab.spec import LabSpec
from ascend_fleet.lab.state import LabState
from ascend_fleet.operations.weights import DEFAULT_MIN_FREE_MARGIN_BYTES

PROJECT = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
BENCH_MODEL = "bench/Synthetic"
# The lab's own tiny model: a first, unshaped run installs each worker's weights server with it.
WARMUP_MODEL = {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "http"}
MODEL_DIR = "/mnt/nvme/models"
PUBLISHED_LINE = re.compile(r"^\s*\[(\S+)\]\s+published \S+ in ([\d.]+)s$", re.MULTILINE)
# nginx's combined log: "GET <path> HTTP/1.1" <status> <body bytes>
MIRROR_GET = re.compile(r'"GET (\S+) HTTP/[\d.]+" \d{3} (\d+)')


@dataclass
class Run:
    """One staging: the slowest stager's time, pyinfra's wall time, every host's stager time, and
    the bytes of the model the origin (the mirror) sent."""

    seconds: float
    wall_seconds: float
    hosts: dict[str, float]
    origin_bytes: int


def bench_lab_dir(lab_dir: Path) -> Path:
    return lab_dir.with_name(f"{lab_dir.name}-bench-weights")


def run_bench(nodes: int, size_gb: float, rate_mbit: float, shards: int, name: str, subnet: str,
              lab_dir: Path, console: Console, skip_origin: bool = False) -> dict:
    """Bring up the bench lab, stage the three ways (two with skip_origin: the origin run is the
    slowest by far, about N times one), take the lab down; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as scratch:
        hardware = Path(scratch) / "hardware.yaml"
        # Disks just big enough: the model, the stage's free-space margin, a spare GB.
        nvme_gb = math.ceil(size_gb + DEFAULT_MIN_FREE_MARGIN_BYTES / 1024**3 + 1)
        hardware.write_text(yaml.safe_dump({"defaults": {"nvme": {"size_gb": nvme_gb}}}))
        spec = LabSpec.build(nodes, hardware, name=name, subnet=subnet, lab_dir=bench_lab_dir(lab_dir),
                             profiles=["lab"])
    parent = LabState.load(lab_dir) or LabState(lab_dir, None, [])
    entry = parent.record("lab", path=str(spec.lab_dir))
    try:
        lab.up(spec, console)
        workers = [node.name for node in spec.workers]
        with console.status(f"building a {size_gb:g} GB model in {shards} shards on the mirror"):
            publish_bench_model(spec, size_gb, shards)
        with console.status("installing every worker's weights server (unshaped)"):
            stage(spec, workers, WARMUP_MODEL, "warmup")
        limit_links(spec, rate_mbit)
        model = {"id": BENCH_MODEL, "revision": "v1", "source": "http"}
        runs = {}
        ways = (("one", workers[:1], True), ("peers", workers, True), ("origin", workers, False))
        for label, hosts, peers in ways[:2] if skip_origin else ways:
            with console.status(f"staging to {len(hosts)} worker(s), {label}"):
                empty_models(spec, workers)
                runs[label] = stage(spec, hosts, {**model, "peers": peers}, label)
            console.print(f"  {label}: {runs[label].seconds:.1f}s (pyinfra {runs[label].wall_seconds:.1f}s)")
    finally:
        with console.status("taking the bench lab down"):
            lab.down(spec.lab_dir)
        parent.resources.remove(entry)
        if parent.spec_data or parent.resources:
            parent.save()
        else:
            parent.remove()
    one = runs["one"].seconds
    return {"workers": nodes, "size_gb": size_gb, "shards": shards, "rate_mbit": rate_mbit,
            "runs": {label: asdict(run) for label, run in runs.items()},
            "ratio": runs["peers"].seconds / one,
            "origin_ratio": runs["origin"].seconds / one if "origin" in runs else None,
            "logs": str(logs_dir(spec))}


def publish_bench_model(spec: LabSpec, size_gb: float, shards: int) -> None:
    # Imported here: numpy and tokenizers would slow every `ascend-fleet` command.
    from ascend_fleet.lab.sim.tinymodel import build_tiny_model

    size_mb = size_gb * 1024
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as building:
        built = build_tiny_model(Path(building), name=BENCH_MODEL, size_mb=size_mb, num_shards=shards,
                                 max_shard_mb=size_mb / shards)
        publish_model(built, mirror_root(spec.lab_dir) / "models")


def empty_models(spec: LabSpec, workers: list[str]) -> None:
    for worker in workers:
        on_node(spec, worker, f"rm -rf {MODEL_DIR}")


def logs_dir(spec: LabSpec) -> Path:
    """Where each run's pyinfra output is kept (the stagers' lines: which file came from where),
    with the origin's access log of the run (<label>-origin.log: when it sent each file, to whom)
    and the workers' peer servers' (<label>-peers.log, each line led by the worker's name: what it
    sent to whom, and its 503s when all its sends were taken)."""
    return spec.lab_dir.with_name(f"{spec.lab_dir.name}-logs")


def stage(spec: LabSpec, hosts: list[str], model: dict, label: str) -> Run:
    """The weights deploy on hosts (the whole lab is its inventory); its stagers' times."""
    argv = [PYINFRA, "-y", "-vvv", "inventories/lab.py", "deploys/weights.py", "--data", f"model={json.dumps(model)}"]
    for host in hosts:
        argv += ["--limit", host]
    access_log = mirror_root(spec.lab_dir) / "run" / "access.log"
    log_offset = access_log.stat().st_size
    peer_offsets = {node.name: int(on_node(spec, node.name, f"stat -c %s {PEER_SERVER_LOG} 2>/dev/null || echo 0"))
                    for node in spec.workers}
    started = time.monotonic()
    result = subprocess.run(argv, cwd=PROJECT, env={**os.environ, "ASCEND_FLEET_LAB_DIR": str(spec.lab_dir)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - started
    log = logs_dir(spec) / f"{label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(result.stdout)
    times = {host: float(seconds) for host, seconds in PUBLISHED_LINE.findall(result.stdout)}
    if result.returncode != 0 or sorted(times) != sorted(hosts):
        raise FleetError(f"bench-weights: staging {model['id']} to {', '.join(hosts)} failed (exit "
                         f"{result.returncode}; published on {', '.join(sorted(times)) or 'none'}): see {log}")
    with access_log.open() as f:
        f.seek(log_offset)
        served = f.read()
    (logs_dir(spec) / f"{label}-origin.log").write_text(served)  # when the origin sent what to whom
    (logs_dir(spec) / f"{label}-peers.log").write_text("".join(
        on_node(spec, worker, f"tail -c +{offset + 1} {PEER_SERVER_LOG} | sed 's/^/{worker} /'")
        for worker, offset in peer_offsets.items()))
    sent = sum(int(size) for path, size in MIRROR_GET.findall(served) if path.startswith(f"/models/{model['id']}/"))
    return Run(max(times.values()), wall, times, sent)


def on_node(spec: LabSpec, node: str, command: str) -> str:
    return run([*lab.ssh_argv(spec.lab_dir, spec.node(node)), command], what=f"{command!r} on {node}").stdout
