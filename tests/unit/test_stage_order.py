"""The order the full deploy runs its stages in, where the order is what makes a node right."""

import pytest

from ascend_fleet.stages import full


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """full_deploy with each stage replaced by one that records its name."""
    names: list[str] = []
    for name in dir(full):
        if name.endswith("_stage"):
            monkeypatch.setattr(full, name, lambda name=name: names.append(name))
    full.full_deploy()
    return names


def test_the_instances_ports_are_reserved_before_any_download_after_preflight_and_the_mirror(ran):
    """A connection a download opens takes an ephemeral port (32768-60999 covers HCCL's 60000 up) and holds it
    in TIME_WAIT for a minute after: reserved first, none of the driver's, CANN's, the wheels' or the weights'
    takes a port of an instance, whose start would then fail to bind it (EJ0003). The lab's openEuler run
    met it once the Python stage got faster: worker1's vllm-0 found port 60014 bound."""
    reserved = ran.index("reserved_ports_stage")
    assert all(ran.index(stage) > reserved for stage in ("driver_stage", "cann_stage", "python_stage",
                                                         "weights_stage", "serve_stage")), ran
    assert ran[:reserved] == ["preflight_stage", "mirror_stage", "firewall_stage"], ran
