"""Host and group data: derived instances and every refusal, one line naming host and key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ascend_fleet.config.fleetstate import FleetState
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig, node_config
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import FIREWALL_UNIT, ROUTE_WATCH_UNIT

WORKER = {
    "profile": "vllm-ascend-0.13.0",
    "chip": "910B3",
    "npu_count": 8,
    "nvme_mount": "/mnt/nvme",
    "tensor_parallel_size": 4,
    "model": {"id": "Qwen/Qwen2.5-72B-Instruct", "revision": "abc123", "source": "modelscope"},
    "serving": {"max_model_len": 32768, "gpu_memory_utilization": 0.9, "dtype": "float16"},
    "npu_env": {"HCCL_BUFFSIZE": 200, "HCCL_OP_EXPANSION_MODE": "AIV"},
}


NPU_ADDRESSES = [f"10.20.0.{11 + npu}" for npu in range(8)]
NPU_NETWORK = {"npu_addresses": NPU_ADDRESSES, "npu_netmask": "255.255.255.0", "npu_gateway": "10.20.0.254"}


TAKES = "(HCCL takes hccl_base_port and the next 31 ports on profile vllm-ascend-0.13.0's CANN)"


def instance(name, npus, port=8000, hccl=60000, vllm=51000) -> dict:
    return {"name": name, "npus": npus, "port": port, "hccl_base_port": hccl, "vllm_port": vllm}


def config(**changes):
    return node_config({**WORKER, **changes}, "worker1")


# --- Derivation ---


def test_8_npus_at_tp4_are_two_instances_with_their_own_npus_and_ports():
    first, second = config().instances
    assert (first.npus, second.npus) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert (first.port, second.port) == (8000, 8001)
    # HCCL takes 32 ports from HCCL_IF_BASE_PORT on the profile's CANN 8.5.0: the ranges must not overlap.
    assert (first.hccl_base_port, second.hccl_base_port) == (60000, 60032)
    assert first.vllm_port != second.vllm_port


def test_derived_hccl_ranges_are_the_profiles_cann_span_apart():
    """The example fleet's four TP2 instances of a node: 32 apart on CANN 8.3 and later (before, 16 apart,
    each one's range overlapped its neighbour's), 16 on the handbook's CANN 8.0."""
    node = config(tensor_parallel_size=2)
    assert node.hccl_port_span == 32
    assert [i.hccl_base_port for i in node.instances] == [60000, 60032, 60064, 60096]
    assert [str(taken) for record in node.instance_records() for taken in record.port_ranges()
            if taken.field == "hccl_base_port"] == [
        "HCCL range 60000-60031", "HCCL range 60032-60063", "HCCL range 60064-60095", "HCCL range 60096-60127"]
    handbook = config(tensor_parallel_size=2, profile="handbook")
    assert [i.hccl_base_port for i in handbook.instances] == [60000, 60016, 60032, 60048]


def test_the_span_comes_from_the_profile_the_data_names():
    asked = []

    def profile_of(name):
        asked.append(name)
        return load_profile("handbook")

    node = node_config({**WORKER, "tensor_parallel_size": 2}, "worker1", profile_of)
    assert asked == ["vllm-ascend-0.13.0"] and node.hccl_port_span == 16


@pytest.mark.parametrize("tp, expected", [(1, 8), (2, 4), (8, 1)])
def test_one_instance_per_tp_group(tp, expected):
    instances = config(tensor_parallel_size=tp).instances
    assert len(instances) == expected
    assert sorted(npu for i in instances for npu in i.npus) == list(range(8))


def test_port_bases_move_every_derived_port():
    instances = config(instance_ports={"api": 9000, "hccl": 61000, "vllm": 52000}).instances
    assert [(i.port, i.hccl_base_port, i.vllm_port) for i in instances] == [(9000, 61000, 52000), (9001, 61032, 52016)]


def test_given_instances_are_kept_as_written():
    given = [instance("big", [0, 1, 2, 3, 4, 5, 6, 7], port=8100)]
    assert [i.name for i in config(tensor_parallel_size=8, instances=given).instances] == ["big"]


def test_defaults_model_dir_served_name_and_string_environment():
    node = config()
    assert node.model_dir == "/mnt/nvme/models"
    assert node.model.served_model_name == "Qwen/Qwen2.5-72B-Instruct"
    assert node.npu_env["HCCL_BUFFSIZE"] == "200"


def test_instance_environment_adds_its_npus_and_ports():
    node = config()
    env = node.instance_env(node.instances[1])
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert (env["HCCL_IF_BASE_PORT"], env["VLLM_PORT"]) == ("60032", "51016")
    assert env["HCCL_OP_EXPANSION_MODE"] == "AIV"


def test_an_http_model_without_url_comes_from_the_model_mirror():
    node = config(model_mirror_url="http://10.213.0.1:8080", model={"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "http"})
    assert node.model.url == "http://10.213.0.1:8080"


def test_pyinfra_connector_keys_are_not_ours_to_validate():
    assert config(ssh_user="root", ssh_strict_host_key_checking="yes", _sudo=True).host == "worker1"


def test_a_gateway_without_npus_needs_no_model_and_runs_no_instance():
    gateway = node_config({"profile": "lab", "chip": "910B3", "npu_count": 0, "nvme_mount": None,
                           "gateway": {"listen_port": 80, "upstream_name": "vllm_backend"}}, "gateway")
    assert gateway.is_gateway and not gateway.is_worker
    assert gateway.instances == []


def test_each_npu_gets_its_address_and_the_shared_netmask_gateway_and_netdetect():
    settings = config(**NPU_NETWORK).npu_nic_settings()
    assert sorted(settings) == list(range(8))
    assert (settings[3].address, settings[3].netmask) == ("10.20.0.14", "255.255.255.0")
    # Without its own netdetect address, each NPU's net health probes the gateway.
    assert (settings[3].gateway, settings[3].netdetect) == ("10.20.0.254", "10.20.0.254")
    assert config(**NPU_NETWORK, npu_netdetect="10.20.0.1").npu_nic_settings()[0].netdetect == "10.20.0.1"
    assert config().npu_nic_settings() == {}


def test_reads_a_pyinfra_host():
    host = SimpleNamespace(name="worker7", data=SimpleNamespace(dict=lambda: dict(WORKER)))
    assert host_node_config(host).host == "worker7"


def test_green_instances_take_the_next_ports_and_share_the_npus_when_blue_uses_them_all():
    green = config(colour="green").instances
    assert [(i.name, i.npus, i.port, i.hccl_base_port, i.vllm_port) for i in green] == [
        ("vllm-0-green", [0, 1, 2, 3], 8002, 60064, 51032), ("vllm-1-green", [4, 5, 6, 7], 8003, 60096, 51048)]


def test_green_instances_take_the_npus_past_blues_when_the_node_has_them():
    (green,) = config(colour="green", instances=[instance("vllm-0", [0, 1, 2, 3])]).instances
    assert (green.name, green.npus, green.port, green.hccl_base_port) == ("vllm-0-green", [4, 5, 6, 7], 8001, 60032)


def test_the_colour_comes_from_the_fleet_state_unless_the_data_names_one(tmp_path):
    FleetState(tmp_path).set_colours({"worker7": "green"})
    data = {**WORKER, "fleet_state_dir": str(tmp_path)}
    worker7 = SimpleNamespace(name="worker7", data=SimpleNamespace(dict=lambda: data))
    assert [i.port for i in host_node_config(worker7).instances] == [8002, 8003]
    assert [i.port for i in host_node_config(worker7, "blue").instances] == [8000, 8001]
    worker8 = SimpleNamespace(name="worker8", data=SimpleNamespace(dict=lambda: data))
    assert host_node_config(worker8).colour == "blue"



class Run:
    """Stands for the pyinfra State of one run (what host.state is once the run starts)."""


def test_a_run_reads_each_hosts_data_once_and_the_next_run_reads_it_again(tmp_path):
    reads = []
    data = {**WORKER, "fleet_state_dir": str(tmp_path)}
    first_run = Run()
    worker7 = SimpleNamespace(name="worker7", state=first_run, data=SimpleNamespace(dict=lambda: reads.append(1) or data))
    assert host_node_config(worker7).colour == "blue"
    FleetState(tmp_path).set_colours({"worker7": "green"})  # e.g. a swap between two runs
    assert host_node_config(worker7).colour == "blue" and len(reads) == 1
    assert host_node_config(worker7, "green").colour == "green" and len(reads) == 2
    worker7.state = Run()
    assert host_node_config(worker7).colour == "green" and len(reads) == 3
    # Outside a run (a rollout's own process), every call reads again.
    del worker7.state
    host_node_config(worker7), host_node_config(worker7)
    assert len(reads) == 5


# --- Refusals: `<host>: <key>: <what was expected>` on one line. ---

REFUSALS = {
    "misspelt key": ({"tensor_paralel_size": 4},
                     "worker1: tensor_paralel_size: unknown key (did you mean `tensor_parallel_size`?)"),
    "misspelt nested key": ({"serving": {**WORKER["serving"], "max_num_seq": 8}},
                            "worker1: serving.max_num_seq: unknown key (did you mean `max_num_seqs`?)"),
    "key in the wrong place": ({"max_model_len": 4096},
                               "worker1: max_model_len: unknown key (did you mean `serving.max_model_len`?)"),
    "unknown profile": ({"profile": "prod-stack"}, "worker1: profile: unknown profile 'prod-stack'; expected one of: handbook,"),
    "unknown chip": ({"chip": "910A"}, "worker1: chip: Input should be '910B3' or '910B4'"),
    "missing serving": ({"serving": None}, "worker1: serving: missing; required on a node with NPUs (npu_count 8)"),
    "model source": ({"model": {"id": "Qwen/Qwen2.5-72B-Instruct", "revision": "r", "source": "s3"}},
                     "worker1: model.source: Input should be 'modelscope', 'hf', 'http' or 'rsync'"),
    "http without url": ({"model": {"id": "a/b", "revision": "r", "source": "http"}}, "worker1: model: source http needs url"),
    "rsync without peer": ({"model": {"id": "a/b", "revision": "r", "source": "rsync"}}, "worker1: model: source rsync needs peer"),
    "url on modelscope": ({"model": {"id": "a/b", "revision": "r", "source": "modelscope", "url": "http://x"}},
                          "worker1: model: url is only for source http, not modelscope"),
    "tp not dividing": ({"tensor_parallel_size": 3},
                        "worker1: tensor_parallel_size: 3 does not divide npu_count 8; expected a divisor of 8, or "
                        "correct npu_count"),
    "instance not one tp group": ({"instances": [instance("a", [0, 1])]},
                                  "worker1: instances.a.npus: 2 NPUs but tensor_parallel_size is 4; expected one TP group of 4"),
    "npu beyond count": ({"instances": [instance("a", [6, 7, 8, 9])]},
                         "worker1: instances.a.npus: NPU 8 does not exist; npu_count is 8 (NPUs 0-7)"),
    "shared npu": ({"instances": [instance("a", [0, 1, 2, 3]), instance("b", [3, 4, 5, 6], 8001, 60032, 51016)]},
                   "worker1: instances: a and b both use NPU 3; expected each NPU used once"),
    # Every port an instance takes (API port, VLLM_PORT and the 15 above, HCCL's 32 on the profile's CANN 8.5.0)
    # against every other port of the host, its own included.
    "shared api port": ({"instances": [instance("a", [0, 1, 2, 3]), instance("b", [4, 5, 6, 7], 8000, 60032, 51016)]},
                        "worker1: instances: a and b both take port 8000; move a's port or b's port"),
    # 16 apart, as data written for CANN 8.0's 16 ports has them.
    "overlapping hccl ranges": ({"instances": [instance("a", [0, 1, 2, 3]), instance("b", [4, 5, 6, 7], 8001, 60016, 51016)]},
                                "worker1: instances: a HCCL range 60000-60031 and b HCCL range 60016-60047 overlap; move "
                                f"a's hccl_base_port or b's hccl_base_port {TAKES}"),
    "shared vllm port": ({"instances": [instance("a", [0, 1, 2, 3]), instance("b", [4, 5, 6, 7], 8001, 60032, 51000)]},
                         "worker1: instances: a VLLM_PORT 51000-51015 and b VLLM_PORT 51000-51015 overlap"),
    "adjacent vllm ports": ({"instances": [instance("a", [0, 1, 2, 3]), instance("b", [4, 5, 6, 7], 8001, 60032, 51001)]},
                            "worker1: instances: a VLLM_PORT 51000-51015 and b VLLM_PORT 51001-51016 overlap; move a's "
                            "vllm_port or b's vllm_port (vLLM takes vllm_port and the next 15 ports)"),
    "api port in another's vllm range": (
        {"instances": [instance("a", [0, 1, 2, 3]), instance("b", [4, 5, 6, 7], 51005, 60032, 51016)]},
        "worker1: instances: b port 51005 lies in a's VLLM_PORT 51000-51015; move a's vllm_port or b's port"),
    "api port in its own hccl range": ({"instances": [instance("vllm-0", [0, 1, 2, 3], 60005, 60000, 51000)]},
                                       "worker1: instances: vllm-0 port 60005 lies in its own HCCL range 60000-60031; "
                                       f"move its port or hccl_base_port {TAKES}"),
    "vllm range over its own hccl range": ({"instances": [instance("a", [0, 1, 2, 3], 8000, 60000, 59990)]},
                                           "worker1: instances: a VLLM_PORT 59990-60005 overlaps its own HCCL range "
                                           "60000-60031; move its vllm_port or hccl_base_port"),
    "derived api port in its own hccl range": ({"instance_ports": {"api": 60005, "hccl": 60000}},
                                               "worker1: instance_ports: vllm-0 port 60005 lies in its own HCCL range "
                                               "60000-60031; move instance_ports.api or instance_ports.hccl (derived "
                                               "instance i takes api + i, vllm + 16i and hccl + 32i;"),
    "derived api ports in the vllm range": ({"instance_ports": {"api": 51001}},
                                            "worker1: instance_ports: vllm-0 port 51001 lies in its own VLLM_PORT "
                                            "51000-51015; move instance_ports.api or instance_ports.vllm"),
    "vllm range past 65535": ({"instances": [instance("a", [0, 1, 2, 3], 8000, 60000, 65530)]},
                              "worker1: instances.0.vllm_port: Input should be less than or equal to 65520 (got 65530)"),
    "duplicate names": ({"instances": [instance("a", [0, 1, 2, 3]), instance("a", [4, 5, 6, 7], 8001, 60032, 51016)]},
                        "worker1: instances: two instances are named a; expected distinct names"),
    "memory utilization": ({"serving": {**WORKER["serving"], "gpu_memory_utilization": 0.99}},
                           "worker1: serving.gpu_memory_utilization: --gpu-memory-utilization 0.99 is above 0.98"),
    # nan and inf (1e309 is inf): a bound compares false with nan, so "less than or equal to 1 (got nan)" said before.
    "nan memory utilization": ({"serving": {**WORKER["serving"], "gpu_memory_utilization": float("nan")}},
                               "worker1: serving.gpu_memory_utilization: Input should be a finite number (got nan)"),
    "1e309 seats": ({"serving": {**WORKER["serving"], "max_num_seqs": 1e309}},
                    "worker1: serving.max_num_seqs: Input should be a finite number (got inf)"),
    "inf alert threshold": ({"monitoring": {"ttft_p99_above_seconds": float("inf")}},
                            "worker1: monitoring.ttft_p99_above_seconds: Input should be a finite number (got inf)"),
    "nan route check interval": ({"gateway": {"isolation": {"interval_seconds": float("nan")}}},
                                 "worker1: gateway.isolation.interval_seconds: Input should be a finite number (got nan)"),
    "nan in a dict-valued option": ({"serving": {**WORKER["serving"], "additional_config": {"x": {"y": float("nan")}}}},
                                    "worker1: serving.additional_config: x.y: nan is no number JSON holds (Python's json "
                                    "writes NaN or Infinity, which vLLM would read as such); give a finite number"),
    "-0 tensor parallel": ({"tensor_parallel_size": -0.0},
                           "worker1: tensor_parallel_size: Input should be greater than or equal to 1 (got -0.0)"),
    "per-instance env": ({"npu_env": {"VLLM_PORT": 9000}}, "worker1: npu_env: VLLM_PORT is set per instance (see instances), not fleet-wide"),
    "hccl buffsize": ({"npu_env": {"HCCL_BUFFSIZE": "big"}}, "worker1: npu_env: HCCL_BUFFSIZE='big': HCCL_BUFFSIZE is "
                      "the size in MB of the buffer HCCL shares data between two NPUs through (CANN's environment "
                      "variable reference): a whole number of at least 1, e.g. 200"),
    # CANN's numeric variables in the ranges its environment variable reference gives (cann_env.yaml).
    "connect timeout below CANN's least": ({"npu_env": {"HCCL_CONNECT_TIMEOUT": 60}},
                                           "worker1: npu_env: HCCL_CONNECT_TIMEOUT='60': HCCL_CONNECT_TIMEOUT is the "
                                           "seconds HCCL waits for the NPUs' socket links at start-up (CANN's "
                                           "environment variable reference): a whole number from 120 to 7200, e.g. 1200"),
    "connect timeout above CANN's most": ({"npu_env": {"HCCL_CONNECT_TIMEOUT": "7201"}},
                                          "worker1: npu_env: HCCL_CONNECT_TIMEOUT='7201': HCCL_CONNECT_TIMEOUT is"),
    "negative exec timeout": ({"npu_env": {"HCCL_EXEC_TIMEOUT": -1}}, "worker1: npu_env: HCCL_EXEC_TIMEOUT='-1': "
                              "HCCL_EXEC_TIMEOUT is the seconds an NPU waits for the others during a collective (0 "
                              "never times out) (CANN's environment variable reference): a whole number from 0 to "
                              "2147483647"),
    "exec timeout in minutes": ({"npu_env": {"HCCL_EXEC_TIMEOUT": "30m"}}, "worker1: npu_env: HCCL_EXEC_TIMEOUT='30m': "),
    "rdma timeout past A2's 20": ({"npu_env": {"HCCL_RDMA_TIMEOUT": 24}}, "worker1: npu_env: HCCL_RDMA_TIMEOUT='24': "
                                  "HCCL_RDMA_TIMEOUT is the RDMA NIC's retransmission timeout factor (4.096 us x "
                                  "2^value) (CANN's environment variable reference): a whole number from 5 to 20"),
    "zero rdma retries": ({"npu_env": {"HCCL_RDMA_RETRY_CNT": 0}}, "worker1: npu_env: HCCL_RDMA_RETRY_CNT='0': "
                          "HCCL_RDMA_RETRY_CNT is how many times the RDMA NIC retransmits (CANN's environment variable "
                          "reference): a whole number from 1 to 7, e.g. 7"),
    # npu_env values as the env file and CANN read them (issue 49).
    "zero hccl buffsize": ({"npu_env": {"HCCL_BUFFSIZE": 0}}, "worker1: npu_env: HCCL_BUFFSIZE='0': HCCL_BUFFSIZE is the "
                           "size in MB"),
    "full-width digits": ({"npu_env": {"HCCL_BUFFSIZE": "\uff12\uff10\uff10"}},
                          "worker1: npu_env: HCCL_BUFFSIZE='\\uff12\\uff10\\uff10': holds a digit that is not ASCII "
                          "(e.g. full-width); write it with 0-9"),
    "full-width digit of another variable": ({"npu_env": {"TASK_QUEUE_ENABLE": "\uff12"}},
                                             "worker1: npu_env: TASK_QUEUE_ENABLE='\\uff12': holds a digit that is not "
                                             "ASCII"),
    "inline comment": ({"npu_env": {"HCCL_CONNECT_TIMEOUT": "1200  # seconds"}},
                       "worker1: npu_env: HCCL_CONNECT_TIMEOUT='1200  # seconds': holds a # comment, which the env "
                       "file would pass to CANN as part of the value; drop the comment"),
    "trailing blank": ({"npu_env": {"HCCL_OP_EXPANSION_MODE": "AIV "}},
                       "worker1: npu_env: HCCL_OP_EXPANSION_MODE='AIV ': starts or ends with a blank"),
    "port range": ({"instance_ports": {"api": 70000}}, "worker1: instance_ports.api: Input should be less than or equal to 65535"),
    # HCCL takes its base port and the next 31 (CANN 8.5.0), all within 1024-65520.
    "hccl base past 65520": ({"instance_ports": {"hccl": 65521}},
                             "worker1: instance_ports.hccl: Input should be less than or equal to 65520"),
    "hccl range past 65520": ({"instance_ports": {"hccl": 65500}, "tensor_parallel_size": 8},
                              "worker1: instance_ports.hccl: vllm-0's HCCL range 65500-65531 ends past 65520, the last "
                              f"port HCCL_IF_BASE_PORT's range may take {TAKES}; lower it or run fewer instances"),
    "derived hccl range past 65520": ({"instance_ports": {"hccl": 65480}},
                                      "worker1: instance_ports.hccl: vllm-1's HCCL range 65512-65543 ends past 65520"),
    "derived hccl base past 65520": ({"instance_ports": {"hccl": 65490}},
                                     "worker1: instance_ports: a derived instance's hccl_base_port: Input should be "
                                     "less than or equal to 65520 (got 65522); lower the base ports or run fewer instances"),
    "given hccl range past 65520": ({"instances": [instance("a", [0, 1, 2, 3], 8000, 65500, 51000)]},
                                    "worker1: instances.a.hccl_base_port: a's HCCL range 65500-65531 ends past 65520, the "
                                    f"last port HCCL_IF_BASE_PORT's range may take {TAKES}; lower it"),
    "hccl base below 1024": ({"instances": [instance("a", [0, 1, 2, 3], 8000, 1000, 51000)]},
                             "worker1: instances.0.hccl_base_port: Input should be greater than or equal to 1024"),
    # Hostile values that would reach a unit, an env file or a shell command on the node (issue 29).
    "newline in nvme_mount": ({"nvme_mount": "/mnt/nvme\nx"}, "worker1: nvme_mount: expected one non-empty line without control characters (a newline would end a unit's line or add a variable to an env file)"),
    "relative nvme_mount": ({"nvme_mount": "mnt/nvme"}, "worker1: nvme_mount: expected an absolute path on the node"),
    "newline in revision": ({"model": {**WORKER["model"], "revision": "v1\nExecStartPost=/bin/sh"}},
                            "worker1: model.revision: expected one non-empty line without control characters (a newline would end a unit's line or add a variable to an env file)"),
    "empty served name": ({"model": {**WORKER["model"], "served_model_name": ""}},
                          "worker1: model.served_model_name: expected one word: no space, newline or control character"),
    "spaced served name": ({"model": {**WORKER["model"], "served_model_name": "qwen 3"}},
                           "worker1: model.served_model_name: expected one word"),
    "newline in extra_args": ({"serving": {**WORKER["serving"], "extra_args": ["--x\nExecStartPost=/bin/sh"]}},
                              "worker1: serving.extra_args.0: expected one non-empty line without control characters (a newline would end a unit's line or add a variable to an env file)"),
    "lower-case npu_env key": ({"npu_env": {"hccl_buffsize": "200"}},
                               "worker1: npu_env.hccl_buffsize.[key]: expected an environment variable's name"),
    "spaced npu_env key": ({"npu_env": {"HCCL BUFFSIZE": "200"}},
                           "worker1: npu_env.HCCL BUFFSIZE.[key]: expected an environment variable's name"),
    "newline in an npu_env value": ({"npu_env": {"TASK_QUEUE_ENABLE": "1\nLD_PRELOAD=/tmp/x.so"}},
                                    "worker1: npu_env.TASK_QUEUE_ENABLE: expected one non-empty line without control characters (a newline would end a unit's line or add a variable to an env file)"),
    "npu_env hiding CANN's libraries": ({"npu_env": {"LD_LIBRARY_PATH": "/opt/x"}},
                                        "worker1: npu_env: LD_LIBRARY_PATH would hide the one CANN's set_env.sh sets"),
    "npu_env hiding CANN's home": ({"npu_env": {"ASCEND_TOOLKIT_HOME": "/opt/x"}},
                                   "worker1: npu_env: ASCEND_TOOLKIT_HOME would hide the one CANN's set_env.sh sets"),
    "api key in npu_env": ({"npu_env": {"VLLM_API_KEY": "s3cret"}},
                           "worker1: npu_env: VLLM_API_KEY looks like a credential, and npu.env is readable by every "
                           "user of the node"),
    "token in npu_env": ({"npu_env": {"HF_TOKEN": "hf_x"}}, "worker1: npu_env: HF_TOKEN looks like a credential"),
    "api port 80": ({"instance_ports": {"api": 80}},
                    "worker1: instance_ports.api: 80 is below 1024, which only root may bind; instance vllm-0 runs as "
                    "service_user vllm: pick a port from 1024 to 65535"),
    "given api port 22": ({"instances": [instance("a", [0, 1, 2, 3], 22),
                                         instance("b", [4, 5, 6, 7], 8001, 60016, 51016)]},
                          "worker1: instances.a.port: 22 is below 1024"),
    "peer port on an instance port": ({"model": {**WORKER["model"], "peer_port": 8001}},
                                      "worker1: model.peer_port: 8001 lies in instance vllm-1's port 8001; move "
                                      "model.peer_port or the instance's port"),
    "peer port in a vllm range": ({"model": {**WORKER["model"], "peer_port": 51020}},
                                  "worker1: model.peer_port: 51020 lies in instance vllm-1's VLLM_PORT 51016-51031"),
    "gateway port on an instance port": ({"gateway": {"listen_port": 8000}},
                                         "worker1: gateway.listen_port: 8000 lies in instance vllm-0's port 8000"),
    "command in a mirror url": ({"vendor_mirror_url": "http://mirror/$(reboot)"},
                                "worker1: vendor_mirror_url: expected an http:// or https:// URL without blanks, "
                                "quotes, backslashes, $ or `"),
    "spaced index url": ({"pip_index_url": "http://mirror/simple --trusted-host evil"},
                         "worker1: pip_index_url: expected an http:// or https:// URL"),
    "model url not http": ({"model": {"id": "a/b", "revision": "r", "source": "http", "url": "ftp://mirror"}},
                           "worker1: model.url: expected an http:// or https:// URL"),
    # The NPU network (hccn_tool): one address per NPU, one subnet, the gateway inside it.
    "npu addresses not one per npu": ({"npu_addresses": NPU_ADDRESSES[:4], "npu_netmask": "255.255.255.0"},
                                      "worker1: npu_addresses: 4 addresses for npu_count 8; expected one per NPU"),
    "npu address not ipv4": ({"npu_addresses": ["10.20.0.300", *NPU_ADDRESSES[1:]]},
                             "worker1: npu_addresses.0: Input is not a valid IPv4 address"),
    "npu addresses without netmask": ({"npu_addresses": NPU_ADDRESSES},
                                      "worker1: npu_netmask: missing; required with npu_addresses"),
    "npu netmask not a mask": ({**NPU_NETWORK, "npu_netmask": "255.0.255.0"},
                               "worker1: npu_netmask: 255.0.255.0 is not a netmask"),
    "npu address outside the subnet": ({**NPU_NETWORK, "npu_addresses": [*NPU_ADDRESSES[:7], "10.20.1.8"]},
                                       "worker1: npu_addresses: NPU 7's 10.20.1.8 is outside NPU 0's subnet "
                                       "10.20.0.0/24; the NPU ports of a node share one subnet"),
    "npu address twice": ({**NPU_NETWORK, "npu_addresses": [*NPU_ADDRESSES[:7], "10.20.0.11"]},
                          "worker1: npu_addresses: NPUs 0 and 7 both have 10.20.0.11; expected distinct"),
    "npu gateway outside the subnet": ({**NPU_NETWORK, "npu_gateway": "10.20.1.254"},
                                       "worker1: npu_gateway: 10.20.1.254 is outside the NPUs' subnet 10.20.0.0/24; "
                                       "hccn_tool refuses a gateway outside the address's segment"),
    "npu netdetect is an npu": ({**NPU_NETWORK, "npu_netdetect": "10.20.0.12"},
                                "worker1: npu_netdetect: 10.20.0.12 is an NPU's own address"),
    "npu gateway without addresses": ({"npu_gateway": "10.20.0.254"},
                                      "worker1: npu_gateway: set without npu_addresses"),
}


@pytest.mark.parametrize("changes, expected", REFUSALS.values(), ids=REFUSALS.keys())
def test_bad_data_is_refused_in_one_line_naming_host_and_key(changes, expected):
    with pytest.raises(FleetError) as caught:
        config(**changes)
    message = str(caught.value)
    assert message.startswith(expected)
    assert "\n" not in message


@pytest.mark.parametrize("host, data, expected", [
    ("worker1;\n}\nserver { listen 81; }", {}, "inventory: host 'worker1;\\n}\\nserver { listen 81; }': expected a "
     "host name"),
    ("worker 1", {}, "inventory: host 'worker 1': expected a host name"),
    ("worker1", {"ssh_hostname": "10.0.0.1 backup"}, "worker1: ssh_hostname: '10.0.0.1 backup' is not a DNS name or an "
     "IP address; the gateway's nginx config sends requests to the host by it"),
], ids=["nginx block in a host name", "spaced host name", "spaced ssh_hostname"])
def test_host_names_and_addresses_are_one_word_nginx_takes_whole(host, data, expected):
    with pytest.raises(FleetError) as caught:
        node_config({**WORKER, **data}, host)
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_connector_host_names_and_ip_addresses_are_host_names():
    for host in ("@local", "@docker/ubuntu:22.04", "npu-01.example.internal", "10.0.0.7", "fe80::1"):
        assert node_config(WORKER, host).host == host


@pytest.mark.parametrize("changes, first_line, keys", [
    ({"max_len": 4}, "worker1: max_len: unknown key", "keys: profile, chip, npu_count,"),
    ({"serving": {**WORKER["serving"], "tp": 4}}, "worker1: serving.tp: unknown key", "keys of serving: max_model_len,"),
], ids=["max_len", "serving.tp"])
def test_an_unknown_key_close_to_none_is_one_line_then_the_keys_wrapped_below(changes, first_line, keys):
    with pytest.raises(FleetError) as caught:
        config(**changes)
    first, *listed = str(caught.value).splitlines()
    assert first == first_line
    assert listed[0].startswith(f"  {keys}") and all(line.startswith("    ") for line in listed[1:])
    assert all(len(line) <= 100 for line in listed)


def test_every_host_data_key_is_listed_under_an_unknown_one():
    with pytest.raises(FleetError) as caught:
        config(max_len=4)
    listed = " ".join(str(caught.value).splitlines()[1:]).removeprefix("  keys: ").split(", ")
    assert [key.strip() for key in listed] == [key for key in NodeConfig.model_fields
                                               if key not in ("host", "hccl_port_span")]


def test_a_bundle_without_the_index_the_site_serves_it_at_is_refused_and_its_locks_are_the_default():
    for index in ({}, {"pip_index_url": "http://mirror.site:8070/pypi"}):
        with pytest.raises(FleetError, match="worker1: data: bundle_dir needs pip_index_url http://MIRROR:PORT/simple"):
            config(bundle_dir="bundle", **index)
    served = config(bundle_dir="bundle", pip_index_url="http://mirror.site:8070/simple/")
    assert str(served.pip_locks_path) == "bundle/locks"
    assert served.bundle_url == "http://mirror.site:8070"
    assert str(config(bundle_dir="bundle", pip_index_url="http://m/simple", pip_locks_dir="mine").pip_locks_path) \
        == "mine"


# Names one systemd unit would answer to twice (issue 49): before, each went through, and the serve stage wrote one
# unit over the other (a swap's green vllm-0 over the blue instance named vllm-0-green; an instance over the firewall).
NAME_CLASHES = {
    "a blue name the green set gives another": (
        [instance("vllm-0", [0, 1, 2, 3]), instance("vllm-0-green", [4, 5, 6, 7], 8001, 60032, 51016)],
        "worker1: instances: vllm-0-green is the name the green set gives instance vllm-0 (a blue/green swap runs "
        "both, one unit each); rename vllm-0-green"),
    "the firewall's unit": ([instance("firewall", [0, 1, 2, 3])],
                            f"worker1: instances: firewall's unit {FIREWALL_UNIT} is the fleet's own; "
                            "rename instance firewall"),
    "the route watcher's unit": ([instance("route-watch", [0, 1, 2, 3])],
                                 f"worker1: instances: route-watch's unit {ROUTE_WATCH_UNIT} is the "
                                 "fleet's own"),
}


@pytest.mark.parametrize("instances, refusal", NAME_CLASHES.values(), ids=NAME_CLASHES.keys())
def test_an_instance_name_another_unit_answers_to_is_refused(instances, refusal):
    with pytest.raises(FleetError) as refused:
        config(instances=instances)
    assert str(refused.value).startswith(refusal)


def test_a_colour_in_the_fleet_state_that_is_none_is_refused_naming_the_file(tmp_path):
    """Before: `worker1: colour: Input should be 'blue' or 'green'`, a key the host's data does not have."""
    (tmp_path / "gateway.json").write_text('{"colours": {"worker1": "Green "}}')
    host = SimpleNamespace(name="worker1", data=SimpleNamespace(dict=lambda: {**WORKER, "fleet_state_dir": str(tmp_path)}))
    with pytest.raises(FleetError) as refused:
        host_node_config(host)
    assert str(refused.value) == (f"{tmp_path}/gateway.json: colours.worker1: 'Green ' (a trailing blank) is not a "
                                  "colour; expected blue or green (the set that serves on worker1): correct the file")
