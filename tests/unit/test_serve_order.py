"""The serve stage's order on a node whose layout changes in place: an instance whose new NPUs a later
instance still holds stops that one first (a second claimant of an NPU fails), read from the node's
environment files."""

from __future__ import annotations

import subprocess

from ascend_fleet import TEMPLATES
from ascend_fleet.config.hostdata import InstancePorts, derive_instances
from ascend_fleet.core.node_layout import instance_home
from ascend_fleet.core.templating import render
from ascend_fleet.facts.systemd import InstanceDevices
from ascend_fleet.stages.serving import holders_of_its_npus

PORTS = InstancePorts()


def layout(tensor_parallel_size: int):
    return derive_instances(8, tensor_parallel_size, PORTS, 32)


def devices_on_node(tmp_path, instances) -> dict[str, tuple[int, ...]]:
    """InstanceDevices as a node answers it, over env files the product's own template wrote."""
    for instance in instances:
        (tmp_path / f"{instance.name}.env").write_text(render(
            TEMPLATES / "vllm-instance.env.j2", instance=instance, home=instance_home(instance.name),
            settings={"ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, instance.npus))}, stack_fingerprint="s",
            model_id="m", revision="r", restages=0, api_key=None))
    output = subprocess.run(["sh", "-c", InstanceDevices().command(str(tmp_path))], capture_output=True, text=True,
                            check=True).stdout
    return InstanceDevices().process(output.splitlines())


def test_the_fact_reads_each_instances_npus_from_its_env_file(tmp_path):
    assert devices_on_node(tmp_path, layout(2)) == {"vllm-0": (0, 1), "vllm-1": (2, 3), "vllm-2": (4, 5),
                                                    "vllm-3": (6, 7)}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert devices_on_node(empty, []) == {}  # a node that serves nothing yet


def test_tp2_to_tp4_in_place_stops_the_tp2_neighbour_holding_the_new_npus_first(tmp_path):
    held = devices_on_node(tmp_path, layout(2))
    first, second = layout(4)
    assert holders_of_its_npus(first, [second], held) == ["vllm-1"]  # NPUs 2-3, which vllm-0 now takes
    assert holders_of_its_npus(second, [], held) == []


def test_tp4_to_tp2_and_an_unchanged_layout_stop_nothing_early(tmp_path):
    held = devices_on_node(tmp_path, layout(4))
    smaller = layout(2)
    assert [holders_of_its_npus(i, smaller[n + 1:], held) for n, i in enumerate(smaller)] == [[], [], [], []]
    same = layout(4)
    assert [holders_of_its_npus(i, same[n + 1:], held) for n, i in enumerate(same)] == [[], []]
