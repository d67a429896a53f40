"""A reboot that waits for the node and, when it does not come back, says so in one line."""

from __future__ import annotations

from pyinfra.api import FunctionCommand, operation
from pyinfra.operations import server


@operation(is_idempotent=False)
def rebooted(reboot_timeout: int, why: str):
    """
    Reboot the node and wait until it answers SSH again (pyinfra's server.reboot); a node still
    down after reboot_timeout stops this host with one line naming it and what to do.

    + reboot_timeout: seconds to wait for the node (host data `reboot_timeout`)
    + why: what the reboot is for, for the error line (e.g. "to load the new driver and firmware")
    """
    for command in server.reboot._inner(reboot_timeout=reboot_timeout):
        if isinstance(command, FunctionCommand) and command.function.__name__ == "wait_and_reconnect":
            command = FunctionCommand(_reported_wait, (command.function, reboot_timeout, why), {})
        yield command


def _reported_wait(state, host, wait_and_reconnect, reboot_timeout: int, why: str) -> bool:
    try:
        wait_and_reconnect(state, host)
    except Exception:  # pyinfra raises a bare Exception when the node stays away
        host.log_styled(f"{host.name}: did not come back within {reboot_timeout}s of the reboot {why}; "
                        "power it on or check its console, then rerun the deploy (what is installed stays, "
                        "the rerun goes on from there)", fg="red")
        return False
    return True
