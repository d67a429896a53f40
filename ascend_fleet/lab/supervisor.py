"""Keeps one lab node booted: restarts systemd-nspawn when the node reboots.

systemd-nspawn exits with 133 when the container asks for a reboot; any other exit
means the node powered off or failed, and the supervisor ends too. A `hold` file in
the node directory keeps a rebooting node down (a node that does not come back),
until it is removed.

Run as: python -m ascend_fleet.lab.supervisor NODE_DIR [CGROUP...]
(argv for nspawn in NODE_DIR/nspawn.json; the node's own cgroups, which the supervisor joins
first so that nspawn's payload is the node's alone: ascend_fleet/lab/cgroups.py)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ascend_fleet.lab.cgroups import join
from ascend_fleet.lab.network import forget_npu_settings
from ascend_fleet.lab.processes import children

REBOOT_EXIT_CODE = 133
SHUTDOWN_GRACE_SECONDS = 30
# The node's /proc/sys/net writable, as a server's is (systemd's ENVIRONMENT.md: "network" leaves
# only /proc/sys/net/ writable): the deploy reserves instance ports there.
NSPAWN_ENV = {**os.environ, "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "network"}


class Supervisor:
    def __init__(self, node_dir: Path):
        self.node_dir = node_dir
        self.argv = json.loads((node_dir / "nspawn.json").read_text())
        self.stopping = False
        self.nspawn: subprocess.Popen | None = None

    def log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor: {message}", flush=True)

    def on_stop_signal(self, signum, _frame) -> None:
        self.log(f"signal {signum}: shutting the node down")
        first = not self.stopping
        self.stopping = True
        if self.nspawn and self.nspawn.poll() is None:
            # nspawn turns SIGTERM into an orderly shutdown of the container's systemd.
            self.nspawn.send_signal(signal.SIGTERM)
            if first:  # a daemon: a node down in time ends the supervisor without waiting for it
                timer = threading.Timer(SHUTDOWN_GRACE_SECONDS, self.kill_if_still_up)
                timer.daemon = True
                timer.start()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_stop_signal)
        signal.signal(signal.SIGINT, self.on_stop_signal)
        boots = 0
        while not self.stopping:
            boots += 1
            self.power_on_npus()
            self.nspawn = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, env=NSPAWN_ENV)
            (self.node_dir / "nspawn.pid").write_text(str(self.nspawn.pid))
            self.log(f"boot {boots}: systemd-nspawn pid {self.nspawn.pid}")
            code = self.wait_for_nspawn()
            self.log(f"systemd-nspawn exited with {code}")
            if code != REBOOT_EXIT_CODE:
                return 0 if self.stopping else code
            self.hold_while_asked()
        return 0

    def power_on_npus(self) -> None:
        """The NPUs come up without the settings of the last boot (the driver's start-up applies hccn.conf)."""
        ports = self.node_dir / "npu-ports.json"
        if ports.exists():
            described = json.loads(ports.read_text())
            forget_npu_settings(described["netns"], described["npus"])

    def wait_for_nspawn(self) -> int:
        # A blocking wait: Popen.wait with a timeout polls every 50 ms, a few CPU minutes over a CI run's
        # labs. A stop signal interrupts it (its handler runs, the wait resumes: PEP 475).
        return self.nspawn.wait()

    def kill_if_still_up(self) -> None:
        """The stop signal's grace is over: a node still up is killed."""
        if self.nspawn.returncode is None:  # the main thread reaps it: returncode is set once it exited
            self.log("node did not shut down in time: killing it")
            self.kill_container()

    def kill_container(self) -> None:
        """SIGKILL the container's init (ending its whole PID namespace), then nspawn."""
        for pid in children(self.nspawn.pid):
            subprocess.run(["kill", "-KILL", str(pid)], check=False)
        self.nspawn.kill()

    def hold_while_asked(self) -> None:
        hold = self.node_dir / "hold"
        if hold.exists():
            self.log("hold file present: the node stays down until it is removed")
        while hold.exists() and not self.stopping:
            time.sleep(0.5)


if __name__ == "__main__":
    join(sys.argv[2:])
    sys.exit(Supervisor(Path(sys.argv[1])).run())
