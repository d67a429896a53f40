"""The driver-stage reboot: pyinfra's wait is found and wrapped so a node that stays down is one line."""

from types import SimpleNamespace

from pyinfra.api import FunctionCommand

from ascend_fleet.operations import reboot


def test_pyinfras_wait_step_is_found_and_wrapped():
    # Depends on pyinfra naming its step wait_and_reconnect: an upgrade that renames it fails here,
    # not silently in production (the reboot would still work, without the one-line report).
    commands = list(reboot.rebooted._inner(reboot_timeout=5, why="to load the new driver"))
    waits = [c for c in commands if isinstance(c, FunctionCommand) and c.function is reboot._reported_wait]
    assert len(waits) == 1
    assert waits[0].args[0].__name__ == "wait_and_reconnect"


def test_a_node_that_stays_down_is_one_line_naming_it_and_what_to_do():
    logged = []
    host = SimpleNamespace(name="worker7", log_styled=lambda text, **style: logged.append(text))

    def never_back(state, host):
        raise Exception("Server did not reboot in time")

    assert reboot._reported_wait(None, host, never_back, 900, "to load the new driver") is False
    assert len(logged) == 1 and "\n" not in logged[0]
    assert logged[0].startswith("worker7: did not come back within 900s of the reboot to load the new driver")
    assert "rerun" in logged[0]


def test_a_node_that_comes_back_goes_on():
    host = SimpleNamespace(name="worker7", log_styled=lambda text, **style: None)
    assert reboot._reported_wait(None, host, lambda state, host: None, 900, "x") is True
