"""`ascend-fleet lab ...` commands."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ascend_fleet.core.command_options import above_zero
from ascend_fleet.lab import lab
from ascend_fleet.lab.sim.real_metadata import PYPI_INDEX, PYTORCH_CPU_INDEX, RECORD_FILE, refresh_record
from ascend_fleet.lab.spec import DEFAULT_LAB_DIR, DEFAULT_PROFILES, LabSpec
from ascend_fleet.lab.state import LabState

lab_app = typer.Typer(no_args_is_help=True, help="The rehearsal lab: simulated Ascend nodes on this machine.")
console = Console()

LabDir = Annotated[Path, typer.Option("--lab-dir", envvar="ASCEND_FLEET_LAB_DIR", help="where the lab keeps its state")]


@lab_app.command("up")
def up_command(
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="number of worker nodes (a gateway node is added)")] = 3,
    hardware: Annotated[Optional[Path], typer.Option("--hardware", help="YAML hardware file (see docs/lab.md)")] = None,
    name: Annotated[str, typer.Option("--name", help="lab name, part of its bridge and firewall names")] = "lab",
    subnet: Annotated[str, typer.Option("--subnet", help="IPv4 subnet of the lab bridge")] = "10.213.0.0/24",
    profiles: Annotated[Optional[list[str]], typer.Option(
        "--profile", help=f"a profile the mirror serves packages for (repeatable; default: {', '.join(DEFAULT_PROFILES)})",
    )] = None,
    bastion: Annotated[bool, typer.Option(
        "--bastion", help="a site behind a jump host: a bastion node, the only way from here to the other nodes",
    )] = False,
    offline_bundle: Annotated[Optional[Path], typer.Option(
        "--offline-bundle", help="a site without internet: the nodes reach nothing on this machine, the mirror "
                                 "included, and the gateway serves this bundle (`ascend-fleet bundle`) to them")] = None,
    gateways: Annotated[int, typer.Option(
        "--gateways", min=1, help="gateway nodes; with 2 or more the inventory gives them a virtual address (keepalived) "
                           "on the lab bridge")] = 1,
    lab_dir: LabDir = DEFAULT_LAB_DIR,
) -> None:
    """Bring up N workers and a gateway, each a booted Debian with systemd and sshd."""
    spec = LabSpec.build(nodes, hardware, name=name, subnet=subnet, lab_dir=lab_dir,
                         profiles=profiles or list(DEFAULT_PROFILES), bastion=bastion, gateways=gateways,
                         offline_bundle=offline_bundle.resolve() if offline_bundle else None)
    started = time.monotonic()
    lab.up(spec, console)
    console.print(f"lab up: {len(spec.nodes)} nodes in {time.monotonic() - started:.1f}s")
    print_status(lab.status(lab_dir))


@lab_app.command("down")
def down_command(lab_dir: LabDir = DEFAULT_LAB_DIR) -> None:
    """Remove everything the lab created: processes, mounts, namespaces, links, bridge, files."""
    with console.status("taking the lab down"):
        removed = lab.down(lab_dir)
    console.print("lab down: removed" if removed else f"lab down: no lab in {lab_dir}, nothing to remove")


@lab_app.command("reset")
def reset_command(
    node: Annotated[str, typer.Argument(help="the node to rebuild, e.g. worker2")],
    keep_nvme: Annotated[bool, typer.Option("--keep-nvme", help="keep the NVMe's files (default: empty it)")] = False,
    lab_dir: LabDir = DEFAULT_LAB_DIR,
) -> None:
    """Put one node back to bare metal: the base image, an empty NVMe, a new identity; then boot it.

    Deploy it again with `pyinfra inventories/lab.py deploys/full.py --limit NODE`.
    """
    started = time.monotonic()
    with console.status(f"resetting {node} to bare metal"):
        lab.reset(lab_dir, node, keep_nvme)
    console.print(f"lab reset: {node} is a fresh OS again{' (NVMe kept)' if keep_nvme else ' with an empty NVMe'}, "
                  f"booted in {time.monotonic() - started:.1f}s")


@lab_app.command("power-off")
def power_off_command(node: Annotated[str, typer.Argument(help="the node, e.g. gateway")],
                      lab_dir: LabDir = DEFAULT_LAB_DIR) -> None:
    """Cut a node's power: its link goes down at once and it stays down until `lab power-on`."""
    lab.power_off(lab_dir, node)
    console.print(f"lab: {node} is off")


@lab_app.command("power-on")
def power_on_command(node: Annotated[str, typer.Argument(help="the node, e.g. gateway")],
                     lab_dir: LabDir = DEFAULT_LAB_DIR) -> None:
    """Give a node `lab power-off` took down its power back: it boots."""
    lab.power_on(lab_dir, node)
    console.print(f"lab: {node} is booting")


@lab_app.command("status")
def status_command(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    lab_dir: LabDir = DEFAULT_LAB_DIR,
) -> None:
    """Show the lab's nodes, their state and boot ids, and the mirror."""
    report = lab.status(lab_dir)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_status(report)


@lab_app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh_command(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="node name, e.g. worker1 or gateway")],
    lab_dir: LabDir = DEFAULT_LAB_DIR,
) -> None:
    """Log into a node as root (extra arguments run as a command)."""
    state = LabState.require(lab_dir)
    argv = lab.ssh_argv(lab_dir, state.spec.node(node)) + list(ctx.args)
    os.execvp(argv[0], argv)


@lab_app.command("bench-weights")
def bench_weights_command(
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="number of workers")] = 6,
    size: Annotated[float, typer.Option("--size", callback=above_zero, help="model size in GB")] = 0.25,
    rate: Annotated[float, typer.Option("--rate", callback=above_zero, help="every link's rate, Mbit/s")] = 64,
    shards: Annotated[int, typer.Option("--shards", min=1, help="number of safetensors shards")] = 64,
    name: Annotated[str, typer.Option("--name", help="the bench lab's name")] = "bw",
    subnet: Annotated[str, typer.Option("--subnet", help="the bench lab's subnet")] = "10.213.250.0/24",
    skip_origin: Annotated[bool, typer.Option(
        "--skip-origin", help="leave out the run of every worker from the origin alone (about N times one)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    lab_dir: LabDir = DEFAULT_LAB_DIR,
) -> None:
    """Stage a synthetic model to one worker, then to all, over links limited to one rate: peers vs origin.

    Runs in a lab of its own (<lab-dir>-bench-weights), which it takes down at the end.
    """
    from ascend_fleet.lab.benchweights import run_bench  # numpy and the tiny model builder: only here

    # With --json, stdout is the JSON alone: progress goes to stderr.
    result = run_bench(nodes, size, rate, shards, name, subnet, lab_dir, Console(stderr=True) if as_json else console,
                       skip_origin)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    runs = result["runs"]
    console.print(f"bench-weights: {nodes} workers, {size:g} GB in {shards} shards, every link {rate:g} Mbit/s")
    rows = [("one worker", "one", ""), (f"all {nodes}, from peers", "peers", f"ratio: {result['ratio']:.2f}")]
    if "origin" in runs:
        rows.append((f"all {nodes}, from origin", "origin", f"origin ratio: {result['origin_ratio']:.2f}"))
    for title, key, ratio in rows:
        console.print(f"  {title + ':':22} {runs[key]['seconds']:7.1f}s   origin sent "
                      f"{runs[key]['origin_bytes'] / 1e6:7.1f} MB   {ratio}")
    console.print(f"  each run's pyinfra output: {result['logs']}")


@lab_app.command("refresh-metadata")
def refresh_metadata_command(
    index_url: Annotated[str, typer.Option("--index-url", help="the index to read the real wheels from")] = PYPI_INDEX,
    cpu_index_url: Annotated[str, typer.Option(
        "--cpu-index-url", help="the index of torch's +cpu builds (recorded as unknown when it does not answer)",
    )] = PYTORCH_CPU_INDEX,
) -> None:
    """Read the real wheels' metadata the stand-ins copy again, with pip, into ascend_fleet/lab/sim/real_metadata.json.

    pip reads each wheel's METADATA by HTTP range requests (fast-deps): a few seconds a wheel, no download.
    """
    wheels = refresh_record(index_url, cpu_index_url, progress=typer.echo)
    unknown = [w for w in wheels if w.unknown]
    typer.echo(f"refresh-metadata: {len(wheels)} wheels recorded in {RECORD_FILE}"
               + (f", {len(unknown)} not known (see their `unknown`)" if unknown else ""))


def print_status(report: dict) -> None:
    table = Table(title=f"lab {report['name']} ({report['subnet']}, mirror {report['mirror']['url']}"
                        f"{'' if report['mirror']['running'] else ' DOWN'})")
    for column in ("node", "role", "groups", "address", "state", "NPUs", "NVMe", "boot id"):
        table.add_column(column)
    colours = {"running": "green", "booting": "yellow"}
    for node in report["nodes"]:
        nvme = f"{node['nvme']['size_gb']:g} GB at {node['nvme']['mount']}" if node["nvme"] else "-"
        table.add_row(node["name"], node["role"], ",".join(node["groups"]), node["address"],
                      f"[{colours.get(node['state'], 'red')}]{node['state']}[/]",
                      f"{node['npus']} x {node['chip']}" if node["npus"] else "-", nvme,
                      (node["boot_id"] or "-")[:8])
    console.print(table)
    if report["bastion"]:
        console.print(f"behind a bastion: this machine reaches the nodes through {report['bastion']} alone "
                      f"(ssh -F {report['ssh_config']} NODE), and the gateway's serving port")
    console.print("log in: ascend-fleet lab ssh NODE    inventory: pyinfra inventories/lab.py ...")
