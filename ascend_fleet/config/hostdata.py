"""Host and group data: the validated shape of what inventories and group_data/ give a host.

pyinfra merges the inventory's host data, group_data/<group>.py and group_data/all.py
into `host.data`. `node_config()` turns that mapping into a NodeConfig, or refuses it
with one line naming the host, the key and what was expected, before anything
connects. When the data lists no instances they are derived from the NPU count and
the tensor-parallel size: 8 NPUs at TP4 are two instances on NPUs 0-3 and 4-7, each
with its own API port, HCCL_IF_BASE_PORT range and VLLM_PORT. The one fact of the
profile the data needs is the span of an HCCL range (its CANN's, stack.hccl_port_span).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ascend_fleet.config.fleetstate import BLUE, COLOURS
from ascend_fleet.config.profile import Profile, available_profiles, load_profile, profile_path
from ascend_fleet.config.vllm_config import json_problem, serving_config_problems
from ascend_fleet.core.errors import FleetError, describe_validation, unknown_keys_without_match
from ascend_fleet.core.node_layout import FLEET_UNITS, instance_unit
from ascend_fleet.core.service_ports import (
    NGINX_EXPORTER_PORT,
    NGINX_STATUS_PORT,
    NODE_EXPORTER_PORT,
    PROMETHEUS_PORT,
    ROUTER_METRICS_PORT,
)
from ascend_fleet.sizing.planner import (
    CHIPS,
    DP_RPC_PORT,
    DTYPE_BYTES,
    ERROR,
    QUANTIZED_BYTES_PER_PARAM,
    VLLM_PORT_SPAN,
    InstanceRecord,
    PortClash,
    check_gpu_memory_utilization,
    check_node_instances,
    port_clashes,
    ports_text,
    ranges_overlap,
    speculates_with_mtp,
)

# pyinfra's own keys in host.data: connector settings (ssh_*) and operation defaults (_sudo, ...).
PYINFRA_KEY_PREFIXES = ("ssh_", "_")
# The serve stage sets these per instance; one fleet-wide value would make instances collide.
PER_INSTANCE_ENV = frozenset({"ASCEND_RT_VISIBLE_DEVICES", "HCCL_IF_BASE_PORT", "VLLM_PORT"})
# A multi-node instance's member reaches the others on its own address and NIC (vllm-ascend's
# multi-node guide): data_parallel and serving_address set these per host.
PER_HOST_ENV = ("HCCL_IF_IP", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")
# Paths CANN's set_env.sh sets (captured into npu.env before npu_env, which systemd lets win): one in
# npu_env would hide CANN's libraries or operators from every instance.
CANN_ENV = frozenset({"LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "PYTHONPATH", "ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH",
                      "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH", "TOOLCHAIN_HOME", "ATB_HOME_PATH"})
# npu.env is world-readable (0644): a credential there is every local user's.
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL")
# Below this, only root binds a port; instances run as service_user.
FIRST_UNPRIVILEGED_PORT = 1024
# The ranges CANN's environment variable reference gives its numeric variables, each cited there.
CANN_ENV_FILE = Path(__file__).with_name("cann_env.yaml")
# NodeConfig's own keys, not the data's: node_config sets them.
HIDDEN_KEYS = frozenset({"host", "hccl_port_span"})
# Wrapped lists of valid keys stay this narrow, indented under the error's own line.
KEY_LIST_WIDTH = 100

Port = Annotated[int, Field(ge=1, le=65535)]
# HCCL_IF_BASE_PORT: HCCL takes it and the ports above, as many as its CANN's span (the profile's
# stack.hccl_port_span), and the whole range must lie in 1024-65520 (field notes section 5, HCCL ports):
# the range's end is checked once the profile is read.
HCCL_LAST_PORT = 65520
HcclBasePort = Annotated[int, Field(ge=1024, le=HCCL_LAST_PORT)]
# VLLM_PORT: vLLM takes it and the next VLLM_PORT_SPAN - 1, all within 1-65535.
VllmPort = Annotated[int, Field(ge=1, le=65536 - VLLM_PORT_SPAN)]
Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]*$")]
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(value: str) -> str:
    if not value or CONTROL_CHARACTERS.search(value):
        raise ValueError("expected one non-empty line without control characters (a newline would end a unit's "
                         "line or add a variable to an env file)")
    return value


# An inline comment as group data might write one: the env file passes it to CANN as part of the value.
INLINE_COMMENT = re.compile(r"(^|\s)#")


def _env_value_problem(key: str, value: str) -> str | None:
    """Why an npu_env value is not what its reader takes, or None. systemd's EnvironmentFile and CANN's own
    parsing read the value as written: a digit that is not ASCII (full-width ２, which Python's int() would
    take) is no digit to them, a "# comment" is part of the value, a blank around it too."""
    if any(character.isdigit() and not character.isascii() for character in value):
        return "holds a digit that is not ASCII (e.g. full-width); write it with 0-9"
    if INLINE_COMMENT.search(value):
        return "holds a # comment, which the env file would pass to CANN as part of the value; drop the comment"
    if value != value.strip():
        return "starts or ends with a blank, which the env file would keep in the value; drop it"
    if (bounds := cann_env_bounds().get(key)) and not _in_bounds(value, bounds):
        upto = (f"from {bounds['min']} to {bounds['max']}" if bounds["max"] is not None
                else f"of at least {bounds['min']}")
        return (f"{key} is {bounds['what']} (CANN's environment variable reference): a whole number {upto}, "
                f"e.g. {bounds['example']}")
    return None


def _in_bounds(value: str, bounds: dict) -> bool:
    return bool(re.fullmatch(r"[0-9]+", value)) and bounds["min"] <= int(value) <= (bounds["max"] or int(value))


@lru_cache(maxsize=1)
def cann_env_bounds() -> dict[str, dict]:
    """The ranges of CANN's numeric environment variables (cann_env.yaml, each with its reference page)."""
    return yaml.safe_load(CANN_ENV_FILE.read_text())


def _node_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("expected an absolute path on the node")
    return _one_line(value)


def _path_segment(value: str) -> str:
    _one_line(value)
    if "/" in value or value in (".", ".."):
        raise ValueError("expected one path segment (no /, not . or ..): it names a directory on the node "
                         "(<model_dir>/<org>/<name>/<revision>); for a branch whose name has a /, give its commit")
    return value


def _one_word(value: str) -> str:
    if not value or re.search(r"\s", value) or CONTROL_CHARACTERS.search(value):
        raise ValueError("expected one word: no space, newline or control character")
    return value


def _env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", value):
        raise ValueError("expected an environment variable's name: upper-case letters, digits and _")
    return value


def _url(value: str) -> str:
    if not URL.fullmatch(value):
        raise ValueError("expected an http:// or https:// URL without blanks, quotes, backslashes, $ or ` (it "
                         "reaches commands and messages on the node)")
    return value


# An http(s) URL of the characters RFC 3986 allows, less ' (and no $ or `, which RFC 3986 does not allow).
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")

# Values that reach a unit, an env file or a shell on the node.
OneLine = Annotated[str, AfterValidator(_one_line)]
Url = Annotated[str, AfterValidator(_url)]
NodePath = Annotated[str, AfterValidator(_node_path)]
PathSegment = Annotated[str, AfterValidator(_path_segment)]
OneWord = Annotated[str, AfterValidator(_one_word)]
EnvName = Annotated[str, AfterValidator(_env_name)]
# A Linux interface name: at most 15 characters (IFNAMSIZ - 1), no slash or space.
NicName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,15}$")]


class _Strict(BaseModel):
    # nan and inf (1e309 in Python is inf) are no number the data can mean: a bound compares false with nan,
    # and "Input should be less than or equal to 1 (got nan)" would not say why.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Model(_Strict):
    """The model an instance serves and where its weights come from."""

    id: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="<org>/<name> as the hub spells it")
    revision: PathSegment = Field(description="a tag or commit: weights are pinned; one directory on the node")
    source: Literal["modelscope", "hf", "http", "rsync"]
    url: Url | None = Field(None, description="http: the mirror serving <url>/models/<org>/<name>/<revision>/")
    peer: str | None = Field(None, description="rsync: a host that already holds the weights")
    peers: bool | None = Field(None, description="spread over the fleet: each file from a node that verified it, "
                               "the source only for what none holds yet; default: when more than one worker "
                               "stages this revision")
    peer_port: Port = Field(8090, description="where each worker's nginx serves its verified weights to peers")
    served_model_name: OneWord = Field(description="what /v1/models names, one word (clients send it back as "
                                       "`model`); defaults to id")

    @model_validator(mode="before")
    @classmethod
    def _served_name_defaults_to_id(cls, data):
        if isinstance(data, dict) and "id" in data:
            return {"served_model_name": data["id"], **data}
        return data

    @field_validator("id")
    @classmethod
    def _id_parts_are_directories(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError("expected <org>/<name>, neither . nor ..: each is a directory on the node")
        return value

    @model_validator(mode="after")
    def _source_settings(self) -> Model:
        if self.source == "http" and not self.url:
            raise ValueError("source http needs url: a mirror serving <url>/models/<org>/<name>/<revision>/")
        if self.source == "rsync" and not self.peer:
            raise ValueError("source rsync needs peer: a host that already holds the weights")
        if self.url and self.source != "http":
            raise ValueError(f"url is only for source http, not {self.source}")
        if self.peer and self.source != "rsync":
            raise ValueError(f"peer is only for source rsync, not {self.source}")
        if self.peers and self.source == "rsync":
            raise ValueError("peers spreads what an origin (modelscope, hf, http) serves; source rsync already "
                             "copies from a peer")
        return self


class Serving(_Strict):
    """vLLM serving options shared by every instance of a node."""

    max_model_len: int = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    # None: vLLM's own default (V1 turns both on); True/False: --enable-X / --no-enable-X.
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    dtype: Literal[tuple(DTYPE_BYTES)] = "bfloat16"
    # vllm-ascend's quantization method for msModelSlim weights (W8A8, W4A8); vLLM refuses the scheme names.
    quantization: Literal["ascend"] | None = None
    quantization_scheme: Literal[tuple(QUANTIZED_BYTES_PER_PARAM)] | None = Field(
        None, description="the weights' scheme, for the planner's sizes, with quantization: ascend; the "
        "planner takes the weights' quant_model_description.json before it")
    block_size: int | None = Field(None, gt=0)
    enable_expert_parallel: bool | None = None
    async_scheduling: bool | None = None
    speculative_config: dict | None = Field(None, description="--speculative-config, e.g. the MTP head of "
                                            "Qwen3.5: {method: qwen3_5_mtp, num_speculative_tokens: 1}")
    compilation_config: dict | None = Field(None, description='--compilation-config, e.g. {cudagraph_mode: FULL_DECODE_ONLY}')
    additional_config: dict | None = Field(None, description="--additional-config, vllm-ascend's own options")
    mamba_ssm_cache_dtype: str | None = None
    enable_auto_tool_choice: bool | None = Field(
        None, description="--enable-auto-tool-choice: the model decides when to call the request's tools "
        '(tool_choice "auto", the default when a request sends tools); without it vLLM answers such a request '
        "400; needs tool_call_parser")
    tool_call_parser: Identifier | None = Field(
        None, description="--tool-call-parser: how vLLM reads tool calls out of the model's text, one of the "
        "pinned vLLM's parser names (vllm_options/<version>.json); Qwen3.5: qwen3_coder")
    reasoning_parser: Identifier | None = Field(
        None, description="--reasoning-parser: how vLLM splits the model's thinking out of the answer "
        "(the message's reasoning field), one of the pinned vLLM's parser names; Qwen3.5: qwen3")
    extra_args: list[OneLine] = Field(default_factory=list, description="further vllm serve arguments, verbatim")

    @property
    def speculates_with_mtp(self) -> bool:
        return speculates_with_mtp(self.speculative_config)

    @field_validator("speculative_config", "compilation_config", "additional_config")
    @classmethod
    def _json_objects(cls, value: dict | None) -> dict | None:
        """vLLM reads these options as JSON, which the unit passes it as one word: a value JSON cannot hold (a
        Python set in group data) is refused here, not met by json.dumps while the unit is written."""
        if value is not None and (problem := json_problem(value)):
            raise ValueError(problem)
        return value

    @property
    def config_options(self) -> dict[str, dict | None]:
        """The dict-valued options by vLLM's dest, which its config classes type (vllm_config.py); vllm-ascend's
        additional_config has none: its keys are read one by one across the plugin, untyped."""
        return {"speculative_config": self.speculative_config, "compilation_config": self.compilation_config}

    @model_validator(mode="after")
    def _tool_choice_with_its_parser(self) -> Serving:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice without tool_call_parser: vLLM refuses to start "
                             "(--enable-auto-tool-choice requires --tool-call-parser); set tool_call_parser to "
                             "the model's parser (Qwen3.5: qwen3_coder)")
        if self.tool_call_parser is not None and not self.enable_auto_tool_choice:
            raise ValueError(f"tool_call_parser {self.tool_call_parser} without enable_auto_tool_choice: vLLM "
                             'then makes no tool parser and answers tool_choice "auto" with 400; set '
                             "enable_auto_tool_choice: True too, or drop tool_call_parser")
        return self

    @model_validator(mode="after")
    def _quantization_scheme_with_ascend(self) -> Serving:
        if self.quantization_scheme is not None and self.quantization is None:
            raise ValueError(f"quantization_scheme {self.quantization_scheme} (the weights' msModelSlim scheme) is "
                             "for quantization: ascend; set that too, or drop the scheme")
        return self


class Instance(_Strict):
    """One vLLM process on a node: its NPUs (one TP group) and the ports it claims."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    npus: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    port: Port
    hccl_base_port: HcclBasePort = Field(description="HCCL_IF_BASE_PORT; HCCL takes as many ports from it as the "
                                         "profile's CANN does (stack.hccl_port_span: 32 from CANN 8.3, 16 in 8.0)")
    vllm_port: VllmPort = Field(description=f"VLLM_PORT; vLLM takes {VLLM_PORT_SPAN} ports from it")


class DataParallel(_Strict):
    """One instance over the hosts of an inventory group, as vllm-ascend's multi-node guide serves a
    model bigger than a node (vLLM data parallel across nodes): the group's first host is the head,
    which serves the API; each other host runs headless engines that join it."""

    group: Identifier = Field(description="the inventory group whose hosts serve this instance together, "
                              "in rank order (its first host is the head)")
    size_local: int = Field(1, ge=1, description="--data-parallel-size-local: DP ranks (engines) per host, each a "
                            "TP group of tensor_parallel_size NPUs")
    rpc_port: Port = Field(DP_RPC_PORT, description="--data-parallel-rpc-port: where the members reach the head's "
                           "engine coordination (vLLM's default)")
    api_server_count: int | None = Field(None, ge=1, description="--api-server-count on the head")
    nic: NicName | None = Field(None, description="the host NIC the members reach each other on (serving_address's), "
                                "for every member whose host data names no serving_nic of its own")


class InstancePorts(_Strict):
    """Where derived instances take their ports: instance i gets each base plus i steps."""

    api: Port = 8000
    hccl: HcclBasePort = 60000
    vllm: VllmPort = 51000


# An HTTP header name as clients send it (RFC 9110 token characters nginx maps to a $http_ variable).
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")]


class Routing(_Strict):
    """How a gateway picks the instance for each request (gateway_routes.py says what each does)."""

    policy: Literal["least_conn", "session_affinity", "cache_aware"] = Field(
        "least_conn", description="least_conn: the instance with the fewest requests; session_affinity: nginx "
        "hashes session_header consistently, so a session's turns meet the KV cache of its history; cache_aware: "
        "the vLLM project's vllm-router on each gateway sends a request where its prefix is cached")
    session_header: HeaderName = Field("X-Session-Id", description="session_affinity: the request header that "
                                       "names a session; requests without it are spread as by least_conn")
    router_port: Port = Field(30080, description="cache_aware: where vllm-router listens, on the gateway's "
                                                 "loopback only, behind nginx")


class Isolation(_Strict):
    """Each gateway's route watcher (node/route_watch.py): when an instance leaves routing and when it comes
    back, decided on the gateway itself, so it holds with no control machine."""

    interval_seconds: float = Field(1.0, ge=0.2, le=30, description="how often every instance is checked")
    health_timeout_seconds: float = Field(1.5, gt=0, le=30, description="a /health that does not answer "
                                          "within this fails the check (a hung engine)")
    fails: int = Field(2, ge=1, le=100, description="failed checks in a row before the instance leaves routing")
    passes: int = Field(3, ge=1, le=100, description="passed checks in a row before it comes back")


class Gateway(_Strict):
    """Nginx in front of every instance; present only in the data of gateway hosts."""

    listen_port: Port = 80
    upstream_name: Identifier = "vllm_backend"
    routing: Routing = Field(default_factory=Routing)
    isolation: Isolation = Field(default_factory=Isolation)


# A network interface name as the kernel allows it (IFNAMSIZ 16 with its NUL; no '/', blank or ':').
InterfaceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$")]


def _centiseconds(seconds: float) -> float:
    if round(seconds, 2) != seconds:
        raise ValueError(f"{seconds}: keepalived counts the advert interval in hundredths of a second")
    return seconds


class VirtualAddress(_Strict):
    """One address over every gateway, held by one gateway at a time and moved to a healthy one by
    keepalived (VRRP version 3, unicast between the gateways; virtual_address.py says why)."""

    address: IPv4Interface = Field(description="the address clients use, with its prefix, e.g. 10.0.0.100/24")
    interface: InterfaceName = Field(description="the gateways' interface on the clients' network, which gets it")
    router_id: int = Field(51, ge=1, le=255, description="virtual_router_id: unique among the VRRP routers of "
                                                         "that network")
    advert_seconds: Annotated[float, AfterValidator(_centiseconds)] = Field(
        0.5, ge=0.01, le=40.95, description="how often the holder says it is alive; a peer takes over after 3 "
                                            "of them go unheard")

    @field_validator("address")
    @classmethod
    def _a_host_address_of_its_subnet(cls, address: IPv4Interface) -> IPv4Interface:
        subnet = address.network
        # A /31 or /32 has no network or broadcast address (RFC 3021).
        if subnet.prefixlen <= 30 and address.ip in (subnet.network_address, subnet.broadcast_address):
            which = "network" if address.ip == subnet.network_address else "broadcast"
            raise ValueError(f"{address.ip} is the {which} address of {subnet}, which no host may hold; pick an "
                             "address inside it that no host has")
        return address


# A Prometheus duration, e.g. 30s, 5m, 1h.
Duration = Annotated[str, Field(pattern=r"^[0-9]+(ms|s|m|h|d|w|y)$")]


class Monitoring(_Strict):
    """Prometheus on gateway hosts: how often it looks, and when each alert fires (field notes, section 1.9)."""

    scrape_interval: Duration = "15s"
    evaluation_interval: Duration = "15s"
    retention: Duration = "15d"
    instance_down_for: Duration = Field("1m", description="an instance's /metrics unanswered this long")
    npu_metrics_interval: Duration = Field("5s", description="how often each worker's timer reads npu-smi into "
                                                              "node_exporter's textfile; the gateways' route "
                                                              "watchers read it there, so an instance on an NPU "
                                                              "gone Alarm leaves routing within about this long "
                                                              "plus gateway.isolation's fails checks")
    slo_for: Duration = Field("5m", description="KV cache, TTFT and ITL above their limits this long")
    kv_cache_usage_above: float = Field(0.9, gt=0, le=1)
    ttft_p99_above_seconds: float = Field(2.0, gt=0)
    itl_p99_above_seconds: float = Field(0.05, gt=0)
    alertmanagers: list[str] = Field(default_factory=list, description="host:port of Alertmanagers to notify")


@dataclass(frozen=True)
class NpuNicSettings:
    """What `hccn_tool -i N` sets on one NPU's own NIC (its RoCE port on the parameter plane)."""

    address: str
    netmask: str
    gateway: str | None
    netdetect: str | None


class NodeConfig(_Strict):
    """Everything the deploy stages and the planner need to know about one host."""

    host: str
    profile: str = Field(description="a profiles/<name>.yaml")
    # node_config sets it from the profile: a fact of the CANN release, not of the data.
    hccl_port_span: int | None = Field(None, ge=1, description="the ports HCCL takes from each hccl_base_port")
    chip: Literal[tuple(CHIPS)] | None = None
    npu_count: int = Field(0, ge=0)
    nvme_mount: NodePath | None = None
    model_dir: NodePath | None = Field(None, description="defaults to <nvme_mount>/models")
    model: Model | None = None
    serving: Serving | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    instances: list[Instance] = Field(default_factory=list, description="derived when not given")
    instance_ports: InstancePorts = Field(default_factory=InstancePorts)
    npu_env: dict[EnvName, OneLine] = Field(
        default_factory=dict, description="HCCL and vllm-ascend settings for every instance: upper-case names, "
        "one-line values")
    service_user: str = Field("vllm", pattern=r"^[a-z_][a-z0-9_-]*$")
    gateway: Gateway | None = None
    gateway_vip: VirtualAddress | None = Field(None, description="gateway hosts: one address over all of them "
                                               "(keepalived); the same on every gateway")
    gateway_vrrp_priority: int = Field(100, ge=1, le=254, description="gateway hosts: which takes the virtual "
                                       "address first (higher); a gateway that returns does not take it back")
    monitoring: Monitoring = Field(default_factory=Monitoring, description="used on gateway hosts")
    pip_index_url: Url | None = None
    pip_locks_dir: OneLine | None = Field(None, description="a folder on the control machine with locks "
                                          "(`ascend-fleet profile lock`, a bundle's locks/): the serving stack "
                                          "installs from <profile>.<arch>-py<python>.txt there, else from the "
                                          "profile's committed lock, else step by step; relative to where "
                                          "pyinfra runs")
    site_mirror_port: Port = Field(8070, description="group mirror: where its nginx serves the bundle to the "
                                   "fleet (deploys/mirror.py)")
    bundle_dir: OneLine | None = Field(None, description="a bundle (`ascend-fleet bundle`) on the control machine "
                                       "this site installs from: preflight checks every file against its "
                                       "manifest and that it serves the node's arch and Python, before any "
                                       "change; its locks/ is the default pip_locks_dir")
    vendor_mirror_url: Url | None = None
    model_mirror_url: Url | None = Field(None, description="a mirror serving <url>/models/<org>/<name>/<revision>/: "
                                         "where an http model without a url of its own is fetched from")
    rollout_waves: list[str] = Field(default_factory=list, description="group names, in rollout order")
    fleet_state_dir: str = Field("state", description="the control machine's record of drained instances and "
                                 "rollout progress (fleetstate.py); relative to where pyinfra runs")
    serve_only: list[str] = Field(default_factory=list, description="the serve stage changes only these "
                                  "instances (a model swap, one instance at a time); empty: all")
    colour: Literal[COLOURS] = Field(BLUE, description="which of two instance sets serves: blue is `instances`, "
                                     "green the same beside them (colour_instances); a blue/green swap flips it "
                                     "and the fleet state records it, see host_node_config")
    max_unavailable: int = Field(1, ge=1, description="the most instances a plain deploy restarts at once while "
                                 "they serve through the gateway, each back on /health before the next (one: a "
                                 "config change costs the fleet one instance's capacity at a time, and nginx "
                                 "sends that instance's share to the others); a rollout drains them instead")
    gateway_fail_timeout: int = Field(10, ge=1, description="seconds Nginx keeps an instance out of rotation after "
                                      "max_fails failed attempts (its fail_timeout), even once it answers; a plain "
                                      "deploy's routed restarts wait this long after each instance is back")
    weights_deep_verify: bool = Field(False, description="the verify stage hashes every file of the staged "
                                      "revision on the node against its manifest's sha256 (minutes per 100 GB); "
                                      "a file that differs fails the host, naming it, and the next deploy "
                                      "restages it and restarts the instances; e.g. --data weights_deep_verify=true")
    reboot_timeout: int = Field(900, gt=0, description="seconds the driver stage waits for a node to answer "
                                "SSH again after its reboot before it reports the node as not back")
    instance_firewall: bool = Field(True, description="workers and gateways: an nftables table of the fleet's "
                                    "own lets only those who need them reach the instance, engine, peer, "
                                    "exporter, Prometheus and VRRP ports (ascend_fleet/fleet/firewall.py says who); "
                                    "false where the site's own firewall does it")
    data_parallel: DataParallel | None = Field(None, description="the host serves one instance with the other "
                                               "hosts of a group (a model bigger than a node); group data")
    serving_address: IPv4Address | None = Field(None, description="host data: the host's address on the network "
                                                "the hosts of a multi-node instance reach each other on (HCCL_IF_IP; "
                                                "the head's is --data-parallel-address)")
    serving_nic: NicName | None = Field(None, description="host data: the NIC that carries serving_address (a "
                                        "multi-node member's GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME and "
                                        "HCCL_SOCKET_IFNAME; preflight checks it); default: data_parallel.nic")
    npu_addresses: list[IPv4Address] = Field(
        default_factory=list, description="host data: NPU i's address on the NPUs' own network (the parameter "
        "plane that multi-node HCCL uses; `hccn_tool -i i -ip -s`), one per NPU, all in one subnet; empty: the "
        "deploy leaves the NPU network as it is")
    npu_netmask: IPv4Address | None = Field(None, description="the NPU addresses' netmask, e.g. 255.255.255.0")
    npu_gateway: IPv4Address | None = Field(None, description="`hccn_tool -gateway`: within the NPUs' subnet")
    npu_netdetect: IPv4Address | None = Field(None, description="`hccn_tool -netdetect`: the address each NPU's "
                                              "net health probes (-net_health); default: npu_gateway")
    npu_tls: bool = Field(False, description="the TLS switch every NPU must report (`hccn_tool -tls -g`); the "
                          "whole fleet must agree (vllm-ascend's multi-node checklist)")
    npu_peer_group: Identifier | None = Field(
        None, description="an inventory group whose hosts' NPUs must reach each other (the hosts of one "
        "multi-node instance): each NPU pings the same NPU of every other member before anything serves")
    instance_allowed_sources: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="addresses, networks (CIDR) or names resolved on the control machine "
        "that may reach the instance ports besides the gateway hosts, e.g. a gateway's address on the serving "
        "network or an outside Prometheus")
    monitoring_allowed_sources: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="addresses, networks (CIDR) or names resolved on the control machine "
        "that may reach node_exporter, and on gateways Prometheus and the nginx exporter, besides the monitoring "
        "hosts (the gateways), e.g. an outside Grafana or the operator's network")
    sshd_allowed_sources: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="addresses, networks (CIDR) or names resolved on the control machine: "
        "the only ones the firewall lets reach the host's SSH (ssh_port); empty: SSH is left as it is. The check "
        "refuses a list that leaves out this machine's own address, where it can tell")

    @property
    def pip_locks_path(self) -> Path | None:
        if self.pip_locks_dir:
            return Path(self.pip_locks_dir)
        return Path(self.bundle_dir) / "locks" if self.bundle_dir else None

    @model_validator(mode="before")
    @classmethod
    def _http_models_come_from_the_model_mirror(cls, data):
        """An http model without a url is fetched from the model mirror's models/ tree."""
        if not isinstance(data, dict):
            return data
        model, mirror = data.get("model"), data.get("model_mirror_url")
        if isinstance(model, dict) and model.get("source") == "http" and "url" not in model and mirror:
            return {**data, "model": {**model, "url": mirror.rstrip("/")}}
        return data

    @property
    def bundle_url(self) -> str | None:
        """Where the site serves the bundle: pip_index_url without its /simple."""
        return self.pip_index_url.rstrip("/").removesuffix("/simple") if self.bundle_dir else None

    @model_validator(mode="after")
    def _a_bundle_is_served_by_the_site(self) -> NodeConfig:
        if self.bundle_dir and not (self.pip_index_url or "").rstrip("/").endswith("/simple"):
            raise ValueError("bundle_dir needs pip_index_url http://MIRROR:PORT/simple: where the site serves the "
                             "bundle's simple/ index (the nodes install every package from that mirror)")
        return self

    @field_validator("npu_env", mode="before")
    @classmethod
    def _numbers_are_strings(cls, env):
        """Group data may write HCCL_BUFFSIZE = 200; an environment holds strings."""
        if isinstance(env, dict):
            return {key: str(value) if isinstance(value, int) and not isinstance(value, bool) else value
                    for key, value in env.items()}
        return env

    @field_validator("npu_env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if key in PER_INSTANCE_ENV:
                raise ValueError(f"{key} is set per instance (see instances), not fleet-wide")
            if key in PER_HOST_ENV:
                raise ValueError(f"{key} is set per host from serving_address and serving_nic (or "
                                 "data_parallel.nic), not fleet-wide")
            if key in CANN_ENV:
                raise ValueError(f"{key} would hide the one CANN's set_env.sh sets (the environment stage captures "
                                 "it into npu.env); drop it")
            if SECRET_ENV.search(key):
                raise ValueError(f"{key} looks like a credential, and npu.env is readable by every user of the "
                                 "node; the instances' API key comes from the gateway's (docs/guides/secrets.md)")
        for key, value in env.items():
            if problem := _env_value_problem(key, value):
                raise ValueError(f"{key}={ascii(value)}: {problem}")
        return env

    @property
    def is_worker(self) -> bool:
        return self.npu_count > 0

    @property
    def is_gateway(self) -> bool:
        return self.gateway is not None

    @property
    def npu_subnet(self) -> IPv4Network | None:
        """The subnet of NPU 0's address, which every NPU of the host shares."""
        if not self.npu_addresses or self.npu_netmask is None:
            return None
        return IPv4Network(f"{self.npu_addresses[0]}/{self.npu_netmask}", strict=False)

    def npu_nic_settings(self) -> dict[int, NpuNicSettings]:
        """NPU -> what hccn_tool sets on its NIC; empty when the data plans no NPU network."""
        netdetect = self.npu_netdetect or self.npu_gateway
        return {npu: NpuNicSettings(str(address), str(self.npu_netmask),
                                    str(self.npu_gateway) if self.npu_gateway else None,
                                    str(netdetect) if netdetect else None)
                for npu, address in enumerate(self.npu_addresses)}

    @property
    def member_nic(self) -> str | None:
        """The NIC a multi-node member reaches the others on: its own serving_nic, else its group's."""
        return self.serving_nic or (self.data_parallel.nic if self.data_parallel else None)

    def instance_env(self, instance: Instance) -> dict[str, str]:
        """The environment of one instance's service: the node's settings plus its NPUs and ports."""
        member = {}
        if self.data_parallel:
            member = {"HCCL_IF_IP": str(self.serving_address),
                      **{name: self.member_nic for name in PER_HOST_ENV[1:]}}
        return {
            **self.npu_env,
            **member,
            "ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, instance.npus)),
            "HCCL_IF_BASE_PORT": str(instance.hccl_base_port),
            "VLLM_PORT": str(instance.vllm_port),
        }

    def instance_records(self) -> list[InstanceRecord]:
        """The planner's view of each instance, for its collision checks: NPUs and every port it takes."""
        return [InstanceRecord(i.name, tuple(i.npus), i.port, i.hccl_base_port, i.vllm_port, self.hccl_port_span)
                for i in self.instances]

    @property
    def npus_per_instance(self) -> int:
        """An instance's NPUs on this host: one TP group, or size_local of them on a multi-node member."""
        return self.tensor_parallel_size * (self.data_parallel.size_local if self.data_parallel else 1)


def derive_instances(npu_count: int, tensor_parallel_size: int, ports: InstancePorts,
                     hccl_port_span: int) -> list[Instance]:
    """One instance per TP group of consecutive NPUs, each with its own ports: HCCL ranges hccl_port_span apart."""
    return [
        Instance(
            name=f"vllm-{i}",
            npus=list(range(i * tensor_parallel_size, (i + 1) * tensor_parallel_size)),
            port=ports.api + i,
            hccl_base_port=ports.hccl + i * hccl_port_span,
            vllm_port=ports.vllm + i * VLLM_PORT_SPAN,
        )
        for i in range(npu_count // tensor_parallel_size)
    ]


def colour_instances(instances: list[Instance], colour: str, npu_count: int, hccl_port_span: int) -> list[Instance]:
    """The instances of a colour. Green runs beside blue for a swap: `-green` names, each port
    len(instances) slots further on, and the next NPUs when the node has them, else the same
    NPUs (then HBM must hold both models: the planner's check_blue_green)."""
    if colour == BLUE:
        return instances
    used = [npu for instance in instances for npu in instance.npus]
    span = max(used) - min(used) + 1 if used else 0
    shift = span if max(used, default=0) + span < npu_count else 0
    slots = len(instances)
    return [instance.model_copy(update={
        "name": f"{instance.name}-{colour}", "npus": [npu + shift for npu in instance.npus],
        "port": instance.port + slots, "hccl_base_port": instance.hccl_base_port + slots * hccl_port_span,
        "vllm_port": instance.vllm_port + slots * VLLM_PORT_SPAN}) for instance in instances]


# What an inventory host name and an ssh_hostname may hold: they reach the gateway's nginx config (a server
# address and a comment), Prometheus targets, nftables rules and URLs, so one word of safe characters (a
# pyinfra connector's @ and / included in the name).
HOST_NAME = re.compile(r"@?[A-Za-z0-9_][A-Za-z0-9_.:/-]*")
HOST_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]*")


def node_config(data: Mapping, host: str = "host", profile_of: Callable[[str], Profile] = load_profile) -> NodeConfig:
    """Validate one host's merged data; a problem is a FleetError naming host, key and expectation.
    profile_of(name) gives the profile the data names (the span of an HCCL range is its CANN's): a
    caller that validates many hosts passes one that reads each profile once."""
    if not HOST_NAME.fullmatch(host):
        raise FleetError(f"inventory: host {host!r}: expected a host name (letters, digits and . _ : - only; a "
                         "pyinfra connector's @ and /): it reaches the gateway's nginx config and other files")
    address = data.get("ssh_hostname")
    if address is not None and not HOST_ADDRESS.fullmatch(str(address)):
        raise FleetError(f"{host}: ssh_hostname: {address!r} is not a DNS name or an IP address; the gateway's "
                         "nginx config sends requests to the host by it")
    ours = {key: value for key, value in data.items() if not key.startswith(PYINFRA_KEY_PREFIXES)}
    try:
        config = NodeConfig.model_validate({**ours, "host": host})
    except ValidationError as exc:
        raise FleetError(f"{host}: {describe_validation(exc, NodeConfig, HIDDEN_KEYS)}{_key_lists(exc)}") from None
    if profile_path(config.profile) is None:
        raise FleetError(f"{host}: profile: unknown profile {config.profile!r}; expected one of: "
                         f"{', '.join(available_profiles())}")
    try:
        profile = profile_of(config.profile)
    except FleetError as exc:
        raise FleetError(f"{host}: {exc}") from None
    config = config.model_copy(update={"hccl_port_span": profile.stack.hccl_port_span})
    derived = not config.instances  # the data lists none: instance_ports places them
    try:
        config, blue = _with_derived_values(config)
    except ValidationError as exc:  # instance i takes each base port plus i steps: a late one can leave the range
        raise FleetError(f"{host}: instance_ports: a derived instance's {describe_validation(exc, Instance)}; "
                         "lower the base ports or run fewer instances") from None
    problem = (next(_problems(config, derived, blue), None)
               or next(_serving_option_problems(config, profile.stack.vllm), None))
    if problem:
        key, what = problem
        raise FleetError(f"{host}: {key}: {what}")
    return config


def _with_derived_values(config: NodeConfig) -> tuple[NodeConfig, list[Instance]]:
    """The config with what the data leaves out derived, and its blue instances (its colour's are placed from them)."""
    derived = {}
    if config.model_dir is None and config.nvme_mount:
        derived["model_dir"] = f"{config.nvme_mount.rstrip('/')}/models"
    if config.data_parallel and not config.instances and config.npus_per_instance <= config.npu_count:
        # A multi-node instance's member runs one process for all its local DP ranks.
        derived["instances"] = derive_instances(config.npus_per_instance, config.npus_per_instance,
                                                config.instance_ports, config.hccl_port_span)
    elif not config.instances and config.is_worker and config.npu_count % config.tensor_parallel_size == 0:
        derived["instances"] = derive_instances(config.npu_count, config.tensor_parallel_size, config.instance_ports,
                                                config.hccl_port_span)
    blue = derived.get("instances", config.instances)
    derived["instances"] = colour_instances(blue, config.colour, config.npu_count, config.hccl_port_span)
    return config.model_copy(update=derived), blue


def _key_lists(exc: ValidationError) -> str:
    """Under the error's line, the keys valid where an unknown key with no close match stands, wrapped."""
    lists = ""
    for where, keys in unknown_keys_without_match(exc, NodeConfig, HIDDEN_KEYS).items():
        parent = where.rpartition(".")[0]
        text = f"{f'keys of {parent}' if parent else 'keys'}: {', '.join(keys)}"
        lists += "\n" + textwrap.fill(text, KEY_LIST_WIDTH, initial_indent="  ", subsequent_indent="    ")
    return lists


def _problems(config: NodeConfig, derived: bool, blue: list[Instance]):
    """(key, what was expected) for each way the data cannot work, most basic first."""
    if not config.is_worker:
        if config.npu_addresses:
            yield "npu_addresses", "set on a host without NPUs (npu_count 0); drop it or set npu_count"
    else:
        for key in ("chip", "nvme_mount", "model", "serving"):
            if getattr(config, key) is None:
                yield key, f"missing; required on a node with NPUs (npu_count {config.npu_count})"
        yield from _instance_problems(config, derived, blue)
        yield from _npu_network_problems(config)
        for finding in check_gpu_memory_utilization(config.serving.gpu_memory_utilization) if config.serving else ():
            if finding.severity == ERROR:
                yield "serving.gpu_memory_utilization", finding.message
    yield from port_use_problems(host_ports(config, blue, derived))


def _serving_option_problems(config: NodeConfig, vllm_version: str):
    """Each key of a dict-valued serving option that the profile's vLLM does not take as given."""
    if config.serving is not None:
        yield from serving_config_problems(config.serving.config_options, vllm_version)


def _npu_network_problems(config: NodeConfig):
    """The NPU network plan: one address per NPU, all in one subnet (Atlas A2: the 8 NPU ports of a node
    share a segment), the gateway inside it (hccn_tool refuses a gateway outside the address's segment)."""
    addresses = config.npu_addresses
    if not addresses:
        for key in ("npu_netmask", "npu_gateway", "npu_netdetect", "npu_peer_group"):
            if getattr(config, key) is not None:
                yield key, "set without npu_addresses; give each NPU its address (host data) or drop it"
        return
    if len(addresses) != config.npu_count:
        yield "npu_addresses", (f"{len(addresses)} addresses for npu_count {config.npu_count}; expected one per NPU, "
                                "NPU i's at index i")
        return
    if config.npu_netmask is None:
        yield "npu_netmask", "missing; required with npu_addresses (e.g. 255.255.255.0)"
        return
    try:
        subnet = config.npu_subnet
    except ValueError:
        yield "npu_netmask", f"{config.npu_netmask} is not a netmask; expected e.g. 255.255.255.0"
        return
    for npu, address in enumerate(addresses):
        if addresses.index(address) != npu:
            yield "npu_addresses", f"NPUs {addresses.index(address)} and {npu} both have {address}; expected distinct"
        elif address not in subnet:
            yield "npu_addresses", (f"NPU {npu}'s {address} is outside NPU 0's subnet {subnet}; the NPU ports of a "
                                    "node share one subnet")
        elif address in (subnet.network_address, subnet.broadcast_address):
            yield "npu_addresses", f"NPU {npu}'s {address} is the network or broadcast address of {subnet}"
    if config.npu_gateway is not None and config.npu_gateway not in subnet:
        yield "npu_gateway", (f"{config.npu_gateway} is outside the NPUs' subnet {subnet}; hccn_tool refuses a "
                              "gateway outside the address's segment")
    for key in ("npu_gateway", "npu_netdetect"):
        if getattr(config, key) in addresses:
            yield key, f"{getattr(config, key)} is an NPU's own address; expected the switch side's"


def _data_parallel_problems(config: NodeConfig):
    if config.data_parallel is None:
        return
    if config.npus_per_instance > config.npu_count:
        yield "data_parallel.size_local", (
            f"{config.data_parallel.size_local} ranks of tensor_parallel_size {config.tensor_parallel_size} take "
            f"{config.npus_per_instance} NPUs; the host has {config.npu_count}")
    if config.serving_address is None:
        yield "serving_address", ("missing; a multi-node instance's member needs its address on the network the "
                                  "members reach each other on (host data)")
    if config.member_nic is None:
        yield "serving_nic", ("missing; name the NIC that carries serving_address (host data), or data_parallel.nic "
                              "where every member's has one name")
    if len(config.instances) != 1:
        yield "instances", f"{len(config.instances)} instances; a multi-node instance's member runs exactly one"


def _instance_problems(config: NodeConfig, derived: bool, blue: list[Instance]):
    tp, count = config.tensor_parallel_size, config.npu_count
    yield from _data_parallel_problems(config)
    if not config.instances:
        yield "tensor_parallel_size", (f"{tp} does not divide npu_count {count}; expected a divisor of {count}, or "
                                       "correct npu_count if the host has other than that many NPUs")
    names = [instance.name for instance in config.instances]
    for name in sorted({name for name in names if names.count(name) > 1}):
        yield "instances", f"two instances are named {name}; expected distinct names"
    yield from _instance_name_problems(config, blue)
    for instance in config.instances:
        if len(instance.npus) != config.npus_per_instance:
            yield f"instances.{instance.name}.npus", (
                f"{len(instance.npus)} NPUs but tensor_parallel_size is {tp}; expected one TP group of {tp}"
                if not config.data_parallel else
                f"{len(instance.npus)} NPUs; expected data_parallel.size_local x tensor_parallel_size = "
                f"{config.npus_per_instance}")
        for npu in instance.npus:
            if npu >= count:
                yield f"instances.{instance.name}.npus", f"NPU {npu} does not exist; npu_count is {count} (NPUs 0-{count - 1})"
    for instance in config.instances:
        if instance.port < FIRST_UNPRIVILEGED_PORT:
            yield ("instance_ports.api" if derived else f"instances.{instance.name}.port"), (
                f"{instance.port} is below {FIRST_UNPRIVILEGED_PORT}, which only root may bind; instance "
                f"{instance.name} runs as service_user {config.service_user}: pick a port from 1024 to 65535")
    records = config.instance_records()
    yield from _hccl_range_end_problems(config, records, derived)
    yield from _placement_problems(tuple(records), derived, config.hccl_port_span, config.profile)


def _instance_name_problems(config: NodeConfig, blue: list[Instance]):
    """Names one systemd unit would answer to twice: an instance's and a name another colour gives another
    instance (a swap runs both sets side by side), or the fleet's own unit of that name (node_layout.FLEET_UNITS)."""
    given = {instance.name for instance in blue}
    for colour in COLOURS:
        for instance, coloured in zip(blue, colour_instances(blue, colour, config.npu_count, config.hccl_port_span)):
            if colour != BLUE and coloured.name in given:
                yield "instances", (f"{coloured.name} is the name the {colour} set gives instance {instance.name} (a "
                                    f"blue/green swap runs both, one unit each); rename {coloured.name}")
            if instance_unit(coloured.name) in FLEET_UNITS:
                yield "instances", (f"{coloured.name}'s unit {instance_unit(coloured.name)} is the fleet's own; rename "
                                    f"instance {instance.name}")


def _hccl_range_end_problems(config: NodeConfig, records: list[InstanceRecord], derived: bool):
    """An HCCL range that would run past HCCL_LAST_PORT, now that its span (the profile's CANN's) is known."""
    for record in records:
        hccl = record.hccl_range
        if hccl.ports[-1] > HCCL_LAST_PORT:
            yield ("instance_ports.hccl" if derived else f"instances.{record.name}.hccl_base_port"), (
                f"{record.name}'s {hccl} ends past {HCCL_LAST_PORT}, the last port HCCL_IF_BASE_PORT's range may "
                f"take ({_hccl_takes(config.hccl_port_span, config.profile)}); lower it"
                + (" or run fewer instances" if derived else ""))


# A fleet's alike hosts place alike instances (every argument is a frozen dataclass or a value): each
# placement judged once per process, not once per host.
@lru_cache(maxsize=256)
def _placement_problems(records: tuple[InstanceRecord, ...], derived: bool, span: int,
                        profile: str) -> tuple[tuple[str, str], ...]:
    """(key, what) for each NPU or port the instances share among themselves (host_ports: with the host's
    other services)."""
    problems = [("instances", f"{finding.message}; expected each NPU used once")
                for finding in check_node_instances(records) if finding.code == "shared-npu"]
    problems += [("instance_ports" if derived else "instances",
                  f"{clash}; {_port_remedy(clash, derived, span, profile)}") for clash in port_clashes(records)]
    return tuple(problems)


# Derived instances place each port from the instance_ports base of the same kind.
DERIVED_FROM = {"port": "instance_ports.api", "vllm_port": "instance_ports.vllm", "hccl_base_port": "instance_ports.hccl"}


def _hccl_takes(span: int, profile: str) -> str:
    return f"HCCL takes hccl_base_port and the next {span - 1} ports on profile {profile}'s CANN"


def _port_remedy(clash: PortClash, derived: bool, span: int, profile: str) -> str:
    """Which keys to move, and how many ports each range needs."""
    fields = list(dict.fromkeys((clash.first_range.field, clash.second_range.field)))
    takes = {"vllm_port": f"vLLM takes vllm_port and the next {VLLM_PORT_SPAN - 1} ports",
             "hccl_base_port": _hccl_takes(span, profile)}
    notes = [takes[field] for field in fields if field in takes]
    if derived:
        moves = " or ".join(DERIVED_FROM[field] for field in fields)
        notes.insert(0, f"derived instance i takes api + i, vllm + {VLLM_PORT_SPAN}i and hccl + {span}i")
    elif clash.own:
        moves = "its " + " or ".join(fields)
    else:
        moves = f"{clash.first}'s {clash.first_range.field} or {clash.second}'s {clash.second_range.field}"
    return f"move {moves}" + (f" ({'; '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class PortUse:
    """A port, or a range, one service of a host takes: who takes it as messages name it, the data key that
    moves it (None: the fleet's own port, service_ports.py), and for an instance's its instance."""

    user: str
    ports: range
    key: str | None
    instance: str | None = None
    field: str = ""  # an instance's: the Instance field that places it
    note: str = ""  # a fleet's own port's: on which hosts it is taken

    def __str__(self) -> str:
        return ports_text(self.ports)


# The fleet's own listeners, by role: (who, port, where).
MONITORED_HOST_PORTS = (("node_exporter's port", NODE_EXPORTER_PORT, "on every worker and gateway"),)
GATEWAY_PORTS = (("Prometheus's port", PROMETHEUS_PORT, "on every gateway"),
                 ("the nginx exporter's port", NGINX_EXPORTER_PORT, "on every gateway"),
                 ("nginx's stub_status port", NGINX_STATUS_PORT, "on every gateway's loopback"))
ROUTER_PORTS = (("vllm-router's metrics port", ROUTER_METRICS_PORT, "on the gateway's loopback with routing "
                 "cache_aware"),)


def host_ports(config: NodeConfig, blue: list[Instance], derived: bool, mirror: bool = False,
               head_rpc_port: int | None = None) -> tuple[PortUse, ...]:
    """Every port the host takes, for every role it has: both colours' instances (a swap runs them side by
    side) placed from `blue` (derived: from instance_ports), the weights (and packages' and wheels') peer port,
    the gateway's, vllm-router's, the exporters' and Prometheus's, and, which the inventory tells, the site
    mirror's (a host of group mirror) and a multi-node head's DP RPC port."""
    uses = []
    if config.is_worker:
        placed = tuple((i.name, tuple(i.npus), i.port, i.hccl_base_port, i.vllm_port) for i in blue)
        uses += _instance_port_uses(placed, config.npu_count, config.hccl_port_span, derived)
        if config.model:
            uses.append(PortUse("model.peer_port", _one_port(config.model.peer_port), "model.peer_port"))
    fixed = [*MONITORED_HOST_PORTS] if config.is_worker or config.is_gateway else []
    if config.gateway:
        uses.append(PortUse("gateway.listen_port", _one_port(config.gateway.listen_port), "gateway.listen_port"))
        fixed += GATEWAY_PORTS
        if config.gateway.routing.policy == "cache_aware":
            uses.append(PortUse("gateway.routing.router_port", _one_port(config.gateway.routing.router_port),
                                "gateway.routing.router_port"))
            fixed += ROUTER_PORTS
    if mirror:
        uses.append(PortUse("site_mirror_port", _one_port(config.site_mirror_port), "site_mirror_port"))
    if head_rpc_port is not None:
        uses.append(PortUse("data_parallel.rpc_port", _one_port(head_rpc_port), "data_parallel.rpc_port"))
    uses += [PortUse(who, _one_port(port), None, note=where) for who, port, where in fixed]
    return tuple(uses)


# A fleet's alike workers place alike instances: each placement's uses made once per process, not once per host.
@lru_cache(maxsize=256)
def _instance_port_uses(blue: tuple[tuple, ...], npu_count: int, span: int, derived: bool) -> tuple[PortUse, ...]:
    """The ports of both colours' instances, placed from the blue ones' (name, npus, port, hccl, vllm)."""
    instances = [Instance.model_construct(name=name, npus=list(npus), port=port, hccl_base_port=hccl, vllm_port=vllm)
                 for name, npus, port, hccl, vllm in blue]
    uses = []
    for colour in COLOURS:
        for given, placed in zip(instances, colour_instances(instances, colour, npu_count, span)):
            record = InstanceRecord(placed.name, tuple(placed.npus), placed.port, placed.hccl_base_port,
                                    placed.vllm_port, span)
            uses += [PortUse(str(taken), taken.ports, DERIVED_FROM[taken.field] if derived
                             else f"instances.{given.name}.{taken.field}", placed.name, taken.field)
                     for taken in record.port_ranges()]
    return tuple(uses)


def _one_port(port: int) -> range:
    return range(port, port + 1)


@lru_cache(maxsize=256)
def port_use_problems(uses: tuple[PortUse, ...]) -> tuple[tuple[str, str], ...]:
    """(key, what) for each two of a host's port uses that share a port, naming both; two instances' are
    _placement_problems' (with their remedies)."""
    problems = []
    for index, first in enumerate(uses):
        for second in uses[index + 1:]:
            if first.instance and second.instance or not ranges_overlap(first.ports, second.ports):
                continue
            problems.append(_port_clash(first, second))
    return tuple(dict.fromkeys(problems))


def _port_clash(first: PortUse, second: PortUse) -> tuple[str, str]:
    """Named under the key to move: a listener's before an instance's, the data's before the fleet's own."""
    listener, other = (second, first) if first.instance else (first, second)
    if listener.key is None:
        if other.instance:
            return other.key, (f"instance {other.instance}'s {other.user} takes {listener.user} {listener} "
                               f"({listener.note}); move {other.key}")
        listener, other = other, listener
    if other.instance:
        return listener.key, (f"{listener} lies in instance {other.instance}'s {other.user}; move {listener.key} or "
                              f"the instance's {other.field}")
    if other.key is None:
        return listener.key, f"{listener} is {other.user} ({other.note}); pick another"
    return listener.key, f"{listener} is also {other.key} on this host; give each its own port"
