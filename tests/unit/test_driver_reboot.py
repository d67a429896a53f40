"""When the driver stage reboots a node: its decision read from the node's facts (a fake host), for
the states a real node can be left in by an interrupted run."""

from __future__ import annotations

import subprocess

import pytest

from ascend_fleet.facts.ascend import AscendDriver, AscendFirmware, NpuStatus, RunningFirmware
from ascend_fleet.stages.platform import DRIVER_NOT_LOADED, needs_reboot
from tests.fakehost import FakeHost, on

DRIVER, FIRMWARE = "25.2.0", "7.7.0.6.236"
CONVERGED = {AscendDriver: {"version": DRIVER, "complete": True}, AscendFirmware: FIRMWARE,
             NpuStatus: {"ok": True, "error": ""}, RunningFirmware: FIRMWARE}


@pytest.mark.parametrize("facts, reboots", [
    ({}, False),  # converged: a rerun does not reboot
    ({AscendDriver: {"version": "24.1.0", "complete": True}}, True),  # another driver installed
    ({AscendFirmware: "7.5.0.3.220"}, True),  # another firmware installed
    ({NpuStatus: {"ok": False, "error": DRIVER_NOT_LOADED}}, True),  # the driver installed, never loaded
    # The profile's firmware installed, the NPUs still on the old one: the run stopped before its reboot.
    ({RunningFirmware: "7.5.0.3.220"}, True),
    ({AscendDriver: None, AscendFirmware: None, RunningFirmware: None,
      NpuStatus: {"ok": False, "error": "npu-smi: not installed (no NPU driver)"}}, True),  # a fresh node
], ids=["converged", "driver", "firmware", "driver not loaded", "firmware not running", "fresh"])
def test_the_driver_stage_reboots_exactly_when_the_node_does_not_run_the_profiles_driver_and_firmware(facts, reboots):
    with on(FakeHost({**CONVERGED, **facts})):
        assert needs_reboot(DRIVER, FIRMWARE) is reboots


def test_the_firmware_the_npus_run_is_read_from_npu_smis_board_view():
    # `npu-smi info -t board -i 0` as a 910B node prints it (MindCluster Ascend FaultDiag's guide).
    board = ["        NPU ID                         : 0", "        Software Version               : 23.0.5",
             "        Firmware Version               : 7.1.0.7.220", "        Compatibility                  : OK"]
    script = "printf '%s\\n' " + " ".join(f"'{line}'" for line in board) + " | " + \
        RunningFirmware().command().split("| ", 1)[1]
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.splitlines()
    assert RunningFirmware().process(output) == "7.1.0.7.220"
    assert RunningFirmware().process([]) is None
