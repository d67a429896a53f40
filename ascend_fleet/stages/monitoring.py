"""Stage: monitoring. Prometheus on the gateway group; on every worker, node_exporter with NPU health; on the
gateways, node_exporter with who the route watcher took out of routing and, with a virtual address, whether
each holds it (keepalived's notify program).

Workers: the release's node_exporter (node_os.py names it), and a timer that writes what npu-smi says into
its textfile directory (node/npu_metrics.py explains why a timer). Gateways:
the release's prometheus with the fleet's alert rules, its targets in file_sd files generated
from the inventory (a rollout or swap rewrites them; Prometheus rereads them on its own),
and the nginx exporter reading nginx's stub_status on a loopback-only port.
Rules and config go through `promtool check` before Prometheus reloads them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from ascend_fleet import TEMPLATES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.node_os import NodeOs
from ascend_fleet.core.node_layout import (
    NGINX_STATUS_CONFIG,
    NPU_METRICS_PROGRAM,
    NPU_METRICS_UNIT,
    PROMETHEUS_CONFIG,
    PROMETHEUS_FILE_SD_DIR,
    PROMETHEUS_RULES_FILE,
    TEXTFILE_DIR,
    unit_file,
)
from ascend_fleet.core.service_ports import NGINX_EXPORTER_PORT, NGINX_STATUS_PORT, NODE_EXPORTER_PORT, PROMETHEUS_PORT
from ascend_fleet.core.templating import render
from ascend_fleet.facts.ascend import HttpAnswer
from ascend_fleet.node import npu_metrics
from ascend_fleet.operations import gates, placed
from ascend_fleet.operations.config import checked_config
from ascend_fleet.operations.gateway import nginx_config
from ascend_fleet.stages.context import host_os, os_packages

MONITORING_TEMPLATES = TEMPLATES / "monitoring"
PROMETHEUS_READY_SECONDS = 60
# Not Debian's default job names ("node" scrapes localhost:9100): the first start, on that default
# config, leaves series behind that would read as a down exporter of ours.
SCRAPE_JOBS = ("vllm", "npu_node", "nginx", "gateway_node")


def scrape_targets() -> dict[str, list[dict]]:
    """file_sd target groups per job, from every host of the inventory (also those a --limit leaves
    out): each vLLM instance, each worker's node_exporter, each gateway's nginx exporter, and the
    node_exporter of each gateway."""
    jobs: dict[str, list[dict]] = {job: [] for job in SCRAPE_JOBS}
    for member in inventory:
        config = host_node_config(member)  # the instances of the colour it serves with
        address = member.data.get("ssh_hostname") or member.name
        if config.is_worker:
            model = f"{config.model.id}@{config.model.revision}"
            jobs["vllm"] += [{"targets": [f"{address}:{i.port}"],
                              "labels": {"host": member.name, "instance_name": i.name, "model": model}}
                             for i in config.instances]
            jobs["npu_node"].append({"targets": [f"{address}:{NODE_EXPORTER_PORT}"], "labels": {"host": member.name}})
        if config.is_gateway:
            jobs["nginx"].append({"targets": [f"{address}:{NGINX_EXPORTER_PORT}"], "labels": {"host": member.name}})
        if config.is_gateway:  # who its route watcher took out of routing; whether it holds the virtual address
            jobs["gateway_node"].append({"targets": [f"{address}:{NODE_EXPORTER_PORT}"],
                                         "labels": {"host": member.name}})
    return jobs


def node_exporter_command(known: NodeOs):
    """node_exporter's command line: in the file its unit reads ARGS from, else in a drop-in of the unit."""
    settings = {"textfile_dir": TEXTFILE_DIR, "port": NODE_EXPORTER_PORT}
    if known.node_exporter_args_file:
        return placed.file(name="node_exporter reads the NPU textfile", dest=known.node_exporter_args_file,
                           content=render(MONITORING_TEMPLATES / "node-exporter.default.j2", **settings),
                           mode="644")
    files.directory(name="node_exporter's textfile directory", path=TEXTFILE_DIR, mode="755")
    return placed.file(name="node_exporter reads the NPU textfile", mode="644",
                       dest=f"{unit_file(known.node_exporter.unit)}.service.d/ascend-fleet.conf",
                       content=render(MONITORING_TEMPLATES / "node-exporter-command.conf.j2", **settings))


def node_exporter() -> None:
    """node_exporter, reading its textfile directory."""
    known = host_os()
    os_packages("node_exporter", [known.node_exporter.package])
    command = node_exporter_command(known)
    systemd.service(name="node_exporter running", service=known.node_exporter.unit, running=True, enabled=True,
                    restarted=command.will_change, daemon_reload=command.will_change)


def npu_exporter(interval: str) -> None:
    """node_exporter, and the NPU metrics timer feeding its textfile collector every `interval`."""
    node_exporter()
    script = placed.file(name="NPU metrics script", content=Path(npu_metrics.__file__).read_text(),
                         dest=NPU_METRICS_PROGRAM, mode="755")
    units = [
        placed.file(name=f"Unit {NPU_METRICS_UNIT}.{kind}", dest=unit_file(f"{NPU_METRICS_UNIT}.{kind}"),
                    content=render(MONITORING_TEMPLATES / f"npu-metrics.{kind}.j2", script=NPU_METRICS_PROGRAM,
                                   textfile_dir=TEXTFILE_DIR, interval=interval), mode="644")
        for kind in ("service", "timer")
    ]
    changed = script.will_change or any(unit.will_change for unit in units)
    systemd.service(name=f"NPU metrics every {interval}", service=f"{NPU_METRICS_UNIT}.timer", running=True,
                    enabled=True, restarted=changed, daemon_reload=changed)


def prometheus_problem(port: int) -> str | None:
    """Prometheus answers ready (it is up and has loaded its config), within a minute."""
    deadline = time.monotonic() + PROMETHEUS_READY_SECONDS
    while True:
        answer = host.get_fact(HttpAnswer, url=f"http://127.0.0.1:{port}/-/ready", timeout_seconds=5)
        if answer["status"] == 200:
            return None
        if time.monotonic() > deadline:
            return (f"Prometheus /-/ready answers {answer['status'] or 'nothing'} on port {port}; "
                    "see `journalctl -u prometheus`")
        time.sleep(2)


def prometheus_server(config: NodeConfig) -> None:
    """Prometheus and the nginx exporter on a gateway."""
    monitoring = config.monitoring
    # stub_status first: the exporter's package starts it at once, and it exits when nginx does not answer.
    nginx_config(name="nginx stub_status on loopback (nginx -t, then reload)", dest=NGINX_STATUS_CONFIG,
                 content=render(MONITORING_TEMPLATES / "nginx-status.conf.j2", status_port=NGINX_STATUS_PORT))
    known = host_os()  # preflight refused a release without these packages and their arguments files
    os_packages("Prometheus and the nginx exporter", [known.prometheus.package, known.nginx_exporter.package])
    exporter = placed.file(name="nginx exporter reads stub_status", dest=known.nginx_exporter_args_file,
                           content=render(MONITORING_TEMPLATES / "nginx-exporter.default.j2",
                                          status_port=NGINX_STATUS_PORT, port=NGINX_EXPORTER_PORT), mode="644")
    systemd.service(name="nginx exporter running", service=known.nginx_exporter.unit, running=True, enabled=True,
                    restarted=exporter.will_change)

    files.directory(name="Prometheus targets directory", path=PROMETHEUS_FILE_SD_DIR, mode="755")
    for job, groups in scrape_targets().items():
        placed.file(name=f"Targets of {job}", dest=f"{PROMETHEUS_FILE_SD_DIR}/{job}.json", mode="644",
                    content=render(MONITORING_TEMPLATES / "file_sd.json.j2", target_groups=groups))
    arguments = placed.file(name="Prometheus command line", dest=known.prometheus_args_file, mode="644",
                            content=render(MONITORING_TEMPLATES / "prometheus.default.j2",
                                           retention=monitoring.retention, port=PROMETHEUS_PORT))
    systemd.service(name="Prometheus running", service=known.prometheus.unit, running=True, enabled=True,
                    restarted=arguments.will_change)
    checked_config(name="Alert rules (promtool check rules, then reload)", dest=PROMETHEUS_RULES_FILE,
                   content=render(MONITORING_TEMPLATES / "ascend-fleet.rules.yml.j2", monitoring=monitoring),
                   check=f"promtool check rules {PROMETHEUS_RULES_FILE}", service=known.prometheus.unit,
                   what="alert rules")
    checked_config(name="Prometheus config (promtool check config, then reload)", dest=PROMETHEUS_CONFIG,
                   content=render(MONITORING_TEMPLATES / "prometheus.yml.j2", monitoring=monitoring,
                                  gateway_host=json.dumps(config.host), rules_file=PROMETHEUS_RULES_FILE,
                                  jobs=SCRAPE_JOBS, file_sd_dir=PROMETHEUS_FILE_SD_DIR, prometheus_port=PROMETHEUS_PORT),
                   check=f"promtool check config {PROMETHEUS_CONFIG}", service=known.prometheus.unit,
                   what="Prometheus config")
    gates.passed(name="Prometheus ready", description=f"Prometheus ready on port {PROMETHEUS_PORT}",
                 find_problem=lambda: prometheus_problem(PROMETHEUS_PORT))


@deploy("Monitoring")
def monitoring_stage() -> None:
    gates.stage_begins(name="Stage: monitoring", stage="monitoring")
    config = host_node_config(host)
    if config.is_worker:
        npu_exporter(config.monitoring.npu_metrics_interval)
    if config.is_gateway and not config.is_worker:
        # The route watcher says there who is out of routing, keepalived's notify program whether the
        # gateway holds the virtual address.
        node_exporter()
    if config.is_gateway:
        prometheus_server(config)
