"""Where ascend-fleet puts things on a node: every path, systemd unit and file name, once.

The deploy's stages and operations, the facts that read them back, `status` and the rollout
take them from here, and templates get them as variables. The names the node programs write
themselves (the weights stager's marker and manifest) are theirs, re-exported here. The vendor's
own layout (/usr/local/Ascend and its set_env.sh files) is in facts/ascend.py, beside the facts
that read it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from ascend_fleet.node import stage_weights

# What the weights stager writes under a model directory, as it names it.
MANIFEST_NAME, MARKER_NAME = stage_weights.MANIFEST_NAME, stage_weights.MARKER_NAME
DEEP_VERIFY_NAME = stage_weights.DEEP_VERIFY_NAME
revision_dir = stage_weights.revision_dir

CONFIG_DIR = "/etc/ascend-fleet"
SERVICE_ENV_FILE = f"{CONFIG_DIR}/npu.env"  # the NPU environment every instance starts with
INSTANCE_ENV_DIR = f"{CONFIG_DIR}/instances"  # <name>.env, root only: an instance's own settings and key
# Root-only (0600) env files of the control machine's credentials (ascend_fleet/config/credentials.py).
HUB_TOKENS_FILE = f"{CONFIG_DIR}/hub-tokens.env"  # workers: the weights stager's hub tokens
GATEWAY_API_KEY_FILE = f"{CONFIG_DIR}/api-key.env"  # gateways: the key of the verify stage's probe
FIREWALL_RULES_FILE = f"{CONFIG_DIR}/instance-firewall.nft"
PIP_LOCK_DIR = f"{CONFIG_DIR}/locks"  # the lock (`profile lock`) the serving stack was installed from

PROGRAM_DIR = "/usr/local/lib/ascend-fleet"  # the node programs of ascend_fleet/node, and the unit helper
INSTANCE_HELPER = f"{PROGRAM_DIR}/ascend-fleet-instance"
WEIGHTS_STAGER = f"{PROGRAM_DIR}/stage_weights.pyz"  # the stager package as one archive
WHEELS_HELPER = f"{PROGRAM_DIR}/peer_wheels.py"
NPU_METRICS_PROGRAM = f"{PROGRAM_DIR}/npu-metrics"
KEEPALIVED_NOTIFY_PROGRAM = f"{PROGRAM_DIR}/keepalived-notify"  # gateways: who holds the virtual address
ROUTE_WATCH_PROGRAM = f"{PROGRAM_DIR}/route_watch.py"  # gateways: instances out of routing and back
ROUTES_FILE = f"{CONFIG_DIR}/routes.json"  # gateways: what the route watcher works from (fleet/gateway_routes.py)
ROUTE_WATCH_STATE = "/run/ascend-fleet/routes-state.json"  # gateways: who the watcher took out, why, since when
ROUTE_WATCH_LOCK = "/run/lock/ascend-fleet-routes.lock"  # the watcher's cycle or the stage's apply, one at a time
ROUTE_WATCH_UNIT = "ascend-fleet-route-watch.service"
# Gateways routing cache_aware: the vLLM project's vllm-router in its own virtualenv, behind nginx.
ROUTER_VENV = "/opt/ascend-fleet/vllm-router"
ROUTER_PROGRAM = f"{ROUTER_VENV}/bin/vllm-router"
ROUTER_UNIT = "ascend-fleet-vllm-router.service"
ROUTER_WORKERS_FILE = f"{CONFIG_DIR}/vllm-router-workers.env"  # the workers it starts with; then the watcher's
ROUTER_API_PROGRAM = f"{PROGRAM_DIR}/router_api.py"  # beside ROUTE_WATCH_PROGRAM, which imports it

SYSTEMD_STATE_ROOT = "/var/lib"  # what a unit's StateDirectory= is relative to
SERVICE_HOME = f"{SYSTEMD_STATE_ROOT}/ascend-fleet"  # the service user's home; each instance's below it
CACHE_DIR = "/var/cache/ascend-fleet"
PACKAGE_DIR = f"{CACHE_DIR}/packages"  # verified vendor packages, also served to peers
WHEEL_DIR = f"{CACHE_DIR}/wheels"  # verified wheels, also served to peers
# Answers of slow read-only checks kept under the files they depend on (facts.ascend.kept_answer).
ANSWER_CACHE_DIR = f"{CACHE_DIR}/answers"
INSTALL_LOG = "/var/log/ascend-fleet-install.log"  # every vendor installer's output
INSTALL_LOCK = "/run/lock/ascend-fleet-install.lock"  # held by a vendor installer while it runs
# On the fleet's first gateway: the lease of the run changing the fleet and the records every control
# machine shares (the drained set, the rollout's and the tune's progress), fleetlease.py.
FLEET_LEASE_DIR = "/var/lib/ascend-fleet-lease"

LOGIN_SCRIPT = "/etc/profile.d/ascend-fleet.sh"
SYSCTL_FILE = "/etc/sysctl.d/90-ascend-fleet.conf"
SYSTEMD_DIR = "/etc/systemd/system"
FIREWALL_UNIT = "ascend-fleet-firewall.service"
GOVERNOR_UNIT = "ascend-fleet-cpu-governor.service"
NPU_METRICS_UNIT = "ascend-fleet-npu-metrics"  # a .service and a .timer

NGINX_CONF_DIR = "/etc/nginx/conf.d"
GATEWAY_CONFIG = f"{NGINX_CONF_DIR}/ascend-fleet.conf"
NGINX_STATUS_CONFIG = f"{NGINX_CONF_DIR}/ascend-fleet-status.conf"
# The gateways' virtual address: where Debian's keepalived unit reads its config (ConditionFileNotEmpty).
KEEPALIVED_CONFIG = "/etc/keepalived/keepalived.conf"
PEER_SERVER_CONFIG = f"{NGINX_CONF_DIR}/ascend-fleet-weights.conf"
SITE_MIRROR_CONFIG = f"{NGINX_CONF_DIR}/ascend-fleet-site-mirror.conf"
SITE_MIRROR_ROOT = "/var/lib/ascend-fleet-site-mirror"  # the site's bundle (bundle.py), served to the fleet
BUNDLE_APT_SOURCE = "/etc/apt/sources.list.d/ascend-fleet-bundle.list"  # the bundle's OS packages (os_repository.py)
BUNDLE_DNF_REPO_ID = "ascend-fleet-bundle"
BUNDLE_DNF_REPO = f"/etc/yum.repos.d/{BUNDLE_DNF_REPO_ID}.repo"  # the same on a dnf node
PEER_SERVER_LOG = "/var/log/nginx/ascend-fleet-weights.access.log"  # every file peers fetched from the node
NGINX_ERROR_LOG = "/var/log/nginx/error.log"

PROMETHEUS_DIR = "/etc/prometheus"
PROMETHEUS_CONFIG = f"{PROMETHEUS_DIR}/prometheus.yml"
PROMETHEUS_RULES_FILE = f"{PROMETHEUS_DIR}/ascend-fleet.rules.yml"
PROMETHEUS_FILE_SD_DIR = f"{PROMETHEUS_DIR}/file_sd"  # <job>.json: the targets of each scrape job
# The packages' names, units and the files holding the daemons' command lines differ by release: node_os.py.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # node_exporter's textfile collector reads the NPU metrics here
VIRTUAL_ADDRESS_TEXTFILE = f"{TEXTFILE_DIR}/ascend_fleet_vip.prom"
ROUTE_WATCH_TEXTFILE = f"{TEXTFILE_DIR}/ascend_fleet_routes.prom"  # gateways: who is out of routing
LEAVING_TEXTFILE_PREFIX = "ascend_fleet_leaving_"  # workers: <instance>.prom while its unit stops
# Workers: <instance> while a deploy restarts one no gateway routes to (drained, never served): its stop need
# not wait for the route watchers. Its next start removes it; a reboot clears /run.
OUT_OF_ROUTING_DIR = "/run/ascend-fleet/out-of-routing"


def unit_file(unit: str) -> str:
    return f"{SYSTEMD_DIR}/{unit}"


def out_of_routing_marker(instance: str) -> str:
    return f"{OUT_OF_ROUTING_DIR}/{instance}"


INSTANCE_UNIT_PREFIX = "ascend-fleet-"  # every instance's unit name starts so


# The fleet's own units whose names an instance's could take (instance_unit: the same prefix): an instance
# named `firewall` would overwrite the firewall's unit.
FLEET_UNITS = (FIREWALL_UNIT, GOVERNOR_UNIT, f"{NPU_METRICS_UNIT}.service", ROUTE_WATCH_UNIT, ROUTER_UNIT)


def instance_unit(name: str) -> str:
    """The systemd unit of the instance called name."""
    return f"{INSTANCE_UNIT_PREFIX}{name}.service"


def instance_env_file(name: str) -> str:
    """Root-only: it holds the API key when one is configured."""
    return f"{INSTANCE_ENV_DIR}/{name}.env"


def instance_home(name: str) -> str:
    """The instance's HOME and working directory (its caches below it)."""
    return f"{SERVICE_HOME}/{name}"


def instance_state_directory(name: str) -> str:
    """instance_home as the unit's StateDirectory= names it (systemd creates it, owned by the service user)."""
    return str(PurePosixPath(instance_home(name)).relative_to(SYSTEMD_STATE_ROOT))

