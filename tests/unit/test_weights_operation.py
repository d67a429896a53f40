"""The weights facts and weights.staged's controller side: fact parsing, argument checks, the stager command."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host
from pyinfra.facts.server import Which

from ascend_fleet.errors import FleetError
from ascend_fleet.facts.weights import SIZES_HEADER, FilesystemSpace, StagedModel
from ascend_fleet.node.stage_weights import MARKER_NAME, marker_problems, parse_args
from ascend_fleet.node_layout import HUB_TOKENS_FILE, WEIGHTS_STAGER
from ascend_fleet.operations import weights
from tests.fakehost import FakeHost, commands, fact, new_file, uploads

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


def test_a_node_without_python3_is_refused_in_one_line_before_anything_is_put_on_it():
    with pytest.raises(FleetError, match=r"^worker1: weights lab/Qwen3-Tiny@v1: python3 is missing on the node"):
        staged(None, python3=None)
