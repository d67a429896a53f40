"""The weights facts and weights.staged's controller side: fact parsing, argument checks, the stager command."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host
from pyinfra.facts.server import Which

from ascend_fleet import TEMPLATES
from ascend_fleet.config.hostdata import node_config
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import DEEP_VERIFY_NAME, HUB_TOKENS_FILE, WEIGHTS_STAGER
from ascend_fleet.core.templating import render
from ascend_fleet.facts.weights import DEEP_VERIFY_HEADER, SIZES_HEADER, FilesystemSpace, StagedModel
from ascend_fleet.node.stage_weights import MARKER_NAME, deep_verify_of, marker_problems, parse_args
from ascend_fleet.operations import weights
from ascend_fleet.stages import serving
from tests.fakehost import FakeHost, commands, fact, new_file, on, uploads

MARKER = {"model_id": "lab/Qwen3-Tiny", "revision": "v1", "manifest_sha256": "f" * 64,
          "files": {"config.json": {"size": 714, "sha256": "a" * 64}}}


def test_staged_model_reads_the_marker_of_that_revision_and_lists_sizes():
    command = StagedModel().command("/mnt/nvme/models", "lab/Qwen3-Tiny", "v1").get_raw_value()
    assert f"/mnt/nvme/models/lab/Qwen3-Tiny/v1/{MARKER_NAME}" in shlex.split(command.replace(";", " ; "))
    assert "|| exit 0" in command and "find" in command


def test_staged_model_process_returns_marker_with_sizes_on_disk():
    output = [*json.dumps(MARKER, indent=1).splitlines(), "", SIZES_HEADER,
              f"1150 {MARKER_NAME}", "714 config.json", "9 sub dir/file name.json"]
    fact = StagedModel().process(output)
    assert fact["sizes"] == {MARKER_NAME: 1150, "config.json": 714, "sub dir/file name.json": 9}
    assert marker_problems(fact, fact["sizes"], "lab/Qwen3-Tiny", "v1") == []
    assert marker_problems(fact, {"config.json": 5}, "lab/Qwen3-Tiny", "v1") == [
        "config.json is 5 bytes, the marker says 714"]


def test_staged_model_reads_the_last_deep_verify_beside_the_marker():
    assert DEEP_VERIFY_NAME in StagedModel().command("/mnt/nvme/models", "lab/Qwen3-Tiny", "v1").get_raw_value()
    record = {"manifest_sha256": MARKER["manifest_sha256"], "mismatched": {"config.json": "sha256 b… does not match"}}
    output = [*json.dumps(MARKER).splitlines(), "", DEEP_VERIFY_HEADER, json.dumps(record), "", SIZES_HEADER,
              "714 config.json"]
    fact = StagedModel().process(output)
    assert fact["sizes"] == {"config.json": 714} and fact["deep_verify"] == record
    assert deep_verify_of(fact, fact["deep_verify"])["mismatched"] == record["mismatched"]
    never = StagedModel().process([*json.dumps(MARKER).splitlines(), "", DEEP_VERIFY_HEADER, "", SIZES_HEADER])
    assert never["deep_verify"] is None and deep_verify_of(never, None) == {}
    restaged_before = {**record, "manifest_sha256": "0" * 64}  # of an earlier staging: counts for nothing
    assert deep_verify_of(fact, restaged_before) == {}


def test_staged_model_without_marker_is_none_and_a_broken_marker_is_flagged():
    assert StagedModel().process([]) is None
    broken = StagedModel().process(["{ not json", SIZES_HEADER, "3 config.json"])
    assert broken == {"sizes": {"config.json": 3}, "unreadable": True}
    assert marker_problems(broken, broken["sizes"], "lab/Qwen3-Tiny", "v1")  # never mistaken for staged


def test_filesystem_space_parses_df():
    df = "/dev/loop0     8350298112 24576 8333496320       1% /mnt/nvme data"
    assert FilesystemSpace().process([df]) == {
        "mount": "/mnt/nvme data", "size_bytes": 8350298112, "free_bytes": 8333496320}
    assert FilesystemSpace().process([]) is None
    assert "df -P -B1" in FilesystemSpace().command("/mnt/nvme").get_raw_value()


def stager_words(**overrides) -> list[str]:
    arguments = dict(host_name="worker1", model_id="lab/Qwen3-Tiny", revision="v1", source="http",
                     model_dir="/mnt/nvme/models", url="http://10.213.0.1:8080", peer=None,
                     tokens_env_file=None, min_free_margin_bytes=1024)
    arguments.update(overrides)
    return shlex.split(weights.stager_command(**arguments).get_raw_value())


def test_stager_command_is_what_the_stager_parses():
    words = stager_words(tokens_env_file=HUB_TOKENS_FILE, model_dir="/mnt/my models")
    assert words[:2] == ["python3", weights.WEIGHTS_STAGER]
    args = parse_args(words[2:])
    assert (args.host, args.model_id, args.revision, args.source) == ("worker1", "lab/Qwen3-Tiny", "v1", "http")
    assert str(args.model_dir) == "/mnt/my models" and args.min_free_margin_bytes == 1024
    assert str(args.tokens_env_file) == HUB_TOKENS_FILE
    assert "--peer" not in words


def test_stager_command_spreads_over_the_peers_it_is_given():
    peers = ["http://10.213.0.12:8090", "http://10.213.0.13:8090"]
    args = parse_args(stager_words(peer_urls=peers, origin_start=1 / 3)[2:])
    assert args.peer_url == peers and args.source == "http" and abs(args.origin_start - 1 / 3) < 1e-6
    assert "--peer-url" not in stager_words() and "--origin-start" not in stager_words()
    args = parse_args(stager_words(peer_urls=peers, origin_start=1 / 3, seeder_urls=peers[:1], seeding=True)[2:])
    assert args.seeder_url == peers[:1] and args.seed
    assert not parse_args(stager_words(peer_urls=peers, seeder_urls=peers)[2:]).seed


def test_hostile_peer_and_seeder_urls_reach_the_stager_as_one_word_each():
    hostile = ["http://a b:8090", "http://x;touch /tmp/owned:8090", "http://q'\"%\n:8090"]
    args = parse_args(stager_words(peer_urls=hostile, seeder_urls=hostile[1:], seeding=False)[2:])
    assert args.peer_url == hostile and args.seeder_url == hostile[1:] and not args.seed


def test_the_stager_refuses_a_seeder_that_is_not_a_peer(capsys):
    with pytest.raises(SystemExit):
        parse_args(stager_words(peer_urls=["http://10.213.0.12:8090"], seeder_urls=["http://10.213.0.13:8090"])[2:])
    assert "every --seeder-url must be a --peer-url as well" in capsys.readouterr().err


def test_stager_command_never_carries_a_token_only_the_file_naming_them():
    line = " ".join(stager_words(source="modelscope", url=None, tokens_env_file="/root/tokens.env"))
    assert "TOKEN" not in line and "/root/tokens.env" in line


@pytest.fixture
def on_host():
    with ctx_host.use(SimpleNamespace(name="worker1")):
        yield


@pytest.mark.parametrize("arguments, message", [
    (("Qwen3-8B", "v1", "http", "http://m", None), r"^worker1: weights: model 'Qwen3-8B'"),
    (("Qwen/Qwen3-8B", "v1", "s3", None, None), r"^worker1: weights Qwen/Qwen3-8B@v1: unknown source 's3'"),
    (("Qwen/Qwen3-8B", "v1", "http", None, None), "source http needs url="),
    (("Qwen/Qwen3-8B", "v1", "rsync", None, None), "source rsync needs peer="),
])
def test_bad_arguments_fail_in_one_line_before_the_node_is_touched(on_host, arguments, message):
    with pytest.raises(FleetError, match=message):
        weights.check_arguments(*arguments)


def test_good_arguments_pass(on_host):
    weights.check_arguments("Qwen/Qwen3-8B", "v1", "rsync", None, "root@worker2")
    weights.check_arguments("Qwen/Qwen3-8B", "v1", "modelscope", None, None)


MODEL_DIR = "/mnt/nvme/models"
STAGED = {**MARKER, "sizes": {MARKER_NAME: 1150, "config.json": 714}}


def staged(marker: dict | None, python3: str | None = "/usr/bin/python3") -> tuple[list, list[str]]:
    fake = FakeHost({fact(StagedModel, model_dir=MODEL_DIR, model_id="lab/Qwen3-Tiny", revision="v1"): marker,
                     fact(Which, command="python3"): python3, **new_file(WEIGHTS_STAGER)})
    return commands(weights.staged, fake, model_id="lab/Qwen3-Tiny", revision="v1", source="http",
                    model_dir=MODEL_DIR, url="http://mirror:8080"), fake.noops


def test_a_revision_staged_whole_is_left_alone():
    assert staged(STAGED) == ([], [f"lab/Qwen3-Tiny@v1 is staged at {MODEL_DIR}/lab/Qwen3-Tiny/v1"])


@pytest.mark.parametrize("marker", [None, {**STAGED, "sizes": {MARKER_NAME: 1150, "config.json": 5}},
                                    {**STAGED, "revision": "v0"}],
                         ids=["not staged", "a file cut short", "another revision's marker"])
def test_a_revision_not_staged_whole_is_staged_by_the_node_side_stager(marker):
    steps, _ = staged(marker)
    assert uploads(steps) == {WEIGHTS_STAGER: weights.stager_archive()}
    words = shlex.split(steps[-1].get_raw_value())
    assert words[:2] == ["python3", WEIGHTS_STAGER] and parse_args(words[2:]).host == "worker1"


MISMATCHED = {"manifest_sha256": MARKER["manifest_sha256"], "checked_at": 0, "restages": 0,
              "mismatched": {"config.json": "sha256 b… does not match the manifest's a…"}}


def test_a_file_the_deep_verify_found_unlike_the_manifest_is_restaged_by_the_node_side_stager():
    steps, noops = staged({**STAGED, "deep_verify": MISMATCHED})
    assert noops == [] and shlex.split(steps[-1].get_raw_value())[:2] == ["python3", WEIGHTS_STAGER]
    restaged = {**MISMATCHED, "mismatched": {}, "restages": 1}
    assert staged({**STAGED, "deep_verify": restaged})[0] == []


def test_the_deep_verify_hashes_on_the_node_with_the_stager():
    fake = FakeHost({fact(Which, command="python3"): "/usr/bin/python3", **new_file(WEIGHTS_STAGER)})
    steps = commands(weights.deep_verified, fake, model_id="lab/Qwen3-Tiny", revision="v1", model_dir=MODEL_DIR)
    assert uploads(steps) == {WEIGHTS_STAGER: weights.stager_archive()}
    words = shlex.split(steps[-1].get_raw_value())
    args = parse_args(words[2:])
    assert words[:2] == ["python3", WEIGHTS_STAGER] and args.deep_verify and args.source is None
    assert (args.host, args.model_id, args.revision, str(args.model_dir)) == (
        "worker1", "lab/Qwen3-Tiny", "v1", MODEL_DIR)


LAB_WORKER = {"profile": "lab", "chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme", "tensor_parallel_size": 4,
              "model": {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "modelscope"},
              "serving": {"max_model_len": 2048, "gpu_memory_utilization": 0.9}}
STAGED_KEY = fact(StagedModel, model_dir=MODEL_DIR, model_id="lab/Qwen3-Tiny", revision="v1")
RESTAGED = {**STAGED, "deep_verify": {**MISMATCHED, "mismatched": {}, "restages": 1}}


@pytest.fixture
def one_host_instances(monkeypatch):
    """The lab worker's config for whichever host asks, none of them in a multi-node instance."""
    config = node_config(LAB_WORKER, "worker1")
    monkeypatch.setattr(serving, "host_node_config", lambda worker: config)
    monkeypatch.setattr(serving, "data_parallel_role", lambda name: None)
    return config


def test_an_instance_restarts_onto_restaged_weights_once(one_host_instances):
    """The restage count in the instance environment: up by one in the run whose weights stage restages,
    the same in the runs after it (no second restart), absent before any restage (no restart on upgrade)."""
    config = one_host_instances
    with on(FakeHost({STAGED_KEY: {**STAGED, "deep_verify": MISMATCHED}})):
        assert serving.weights_restages(config) == 0  # a serve stage alone restages nothing: no restart for it
        serving.stages_in_this_run().add("weights")  # what the weights stage of a full run does first
        assert serving.weights_restages(config) == 1
    with on(FakeHost({STAGED_KEY: RESTAGED})):
        assert serving.weights_restages(config) == 1
    environment = {"instance": config.instances[0], "home": "/h", "settings": {}, "stack_fingerprint": "s",
                   "model_id": "lab/Qwen3-Tiny", "revision": "v1", "api_key": None}
    never = render(TEMPLATES / "vllm-instance.env.j2", restages=0, **environment)
    once = render(TEMPLATES / "vllm-instance.env.j2", restages=1, **environment)
    assert never.endswith("ASCEND_FLEET_WEIGHTS=lab/Qwen3-Tiny@v1\n") and "RESTAGED" not in never
    assert once == never + "ASCEND_FLEET_WEIGHTS_RESTAGED=1\n"


def test_the_hosts_of_a_multi_node_instance_count_their_restages_together(one_host_instances, monkeypatch):
    """They restart together: a shard the run restages on the member restarts the head's units too, though
    pyinfra prepares the head's serve stage before the member's weights stage."""
    head = FakeHost({STAGED_KEY: STAGED}, name="npu-01")
    member = FakeHost({STAGED_KEY: {**STAGED, "deep_verify": MISMATCHED}}, name="npu-02")
    monkeypatch.setattr(serving, "data_parallel_role", lambda name: SimpleNamespace(members=("npu-01", "npu-02")))
    monkeypatch.setattr(serving, "inventory", SimpleNamespace(get_host={"npu-01": head, "npu-02": member}.get))
    for host in (head, member):
        with on(host):
            serving.stages_in_this_run().add("weights")
            assert serving.weights_restages(one_host_instances) == 1


def test_a_node_without_python3_is_refused_in_one_line_before_anything_is_put_on_it():
    with pytest.raises(FleetError, match=r"^worker1: weights lab/Qwen3-Tiny@v1: python3 is missing on the node"):
        staged(None, python3=None)
