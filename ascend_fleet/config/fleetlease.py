"""The fleet lease: one run changes a fleet at a time, whichever control machine it runs on.

Several operators work on one fleet from several control machines, so the lock cannot live on a
control machine. It lives on the fleet: in FLEET_LEASE_DIR (node_layout.py) on the inventory's first
gateway, the host every rollout, swap and tune already depends on (it drains there). Beside the lease
lie the records every control machine must share (fleetstate.SHARED_RECORDS: the drained set, the
colours and served instances, the rollout's and the tune's progress).

- Taking it: one SSH round trip (remote.run_script) running one shell script under `flock` on the
  gateway, so two control machines asking at once get one answer each. The lease names its holder
  (user@control-machine, what it runs, its pid, since when) and the time of its last heartbeat, on the
  gateway's clock (the control machines' clocks play no part). The same round trip brings back the
  shared records, which replace the control machine's copies in its `fleet_state_dir` (a record the
  fleet does not have yet is kept, and pushed: how a fleet's first lease adopts its state).
- While held: a heartbeat every HEARTBEAT_SECONDS renews it and pushes the records that changed; the
  rollout also pushes right after every gateway change, so what the fleet records drained is what the
  gateway has (rollout.Runner.set_gateway). Releasing pushes them once more and removes the lease.
- Refused: a lease held by another run is refused in one line naming the holder and its last heartbeat.
- Stale: a lease whose heartbeat is older than STALE_SECONDS is free: a crashed control machine
  wedges the fleet for at most a minute. A lease held from this very control machine whose process has
  ended (its pid gone, or another process under it) is free at once: `--resume` after a `kill -9` need
  not wait.
- A rollout's own children (its pyinfra runs) carry its token in LEASE_ENV and run under it; a plain
  `pyinfra INVENTORY deploys/full.py` (or serve.py, gateway.py, routes.py: the deploys that change what serves)
  takes the lease itself before it connects (fleet_check.check_before_connecting) and releases it at
  exit.

A fleet without a gateway has no lease: nothing is drained there, and no rollout runs on it.
"""

from __future__ import annotations

import atexit
import base64
import getpass
import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyinfra.api import Inventory

from ascend_fleet.config.fleetstate import SHARED_RECORDS, FleetState
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.core import remote
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import FLEET_LEASE_DIR

HEARTBEAT_SECONDS = 10
STALE_SECONDS = 60  # six missed heartbeats
SCRIPT_TIMEOUT_SECONDS = 30
LEASE_ENV = "ASCEND_FLEET_LEASE"  # the token of the lease a run's parent holds (a rollout's pyinfra runs)
# The deploy files that change what serves: a plain run of one takes the lease.
LEASED_DEPLOYS = ("full.py", "serve.py", "gateway.py", "routes.py")
RECORD_MARK = "@@ascend-fleet-record "
DONE = {"take": "taken", "renew": "renewed", "release": "released"}


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough for an operator to find the run, and for this machine to tell it ended."""

    token: str
    who: str  # user@control-machine
    what: str  # e.g. "a rollout of deploys/serve.py"
    pid: int
    started: str  # the process's start time (/proc/PID/stat): a pid used again is another process
    machine: str  # /etc/machine-id of the control machine
    since: str

    @classmethod
    def this_run(cls, what: str) -> Holder:
        return cls(token=uuid.uuid4().hex, who=f"{getpass.getuser()}@{socket.gethostname()}", what=what,
                   pid=os.getpid(), started=process_start(os.getpid()) or "", machine=machine_id(),
                   since=time.strftime("%Y-%m-%d %H:%M:%S %Z"))

    def ended(self) -> bool:
        """Whether its process is known to be gone: only this control machine can tell."""
        return self.machine == machine_id() and process_start(self.pid) != self.started


def machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks after boot, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def lease_script(action: str, holder: Holder, records: Mapping[str, str] | None = None, breaking: str = "",
                 directory: str = FLEET_LEASE_DIR) -> str:
    """The shell script that takes (`take`), renews (`renew`) or gives back (`release`) the lease under
    flock on the lease host, writing `records` beside it. Its first line of output: `taken`, `renewed`,
    `released`; `held AGE` or `lost` (another run holds it; its holder's JSON follows, if any).
    `take` prints the records the fleet has after it, each after a RECORD_MARK line. `breaking`: the
    token of a lease this machine knows has ended, taken over whatever its age."""
    writes = "".join(f"printf %s {shlex.quote(base64.b64encode(text.encode()).decode())} | base64 -d "
                     f"> \"$d/.{name}.new\" && mv \"$d/.{name}.new\" \"$d/{name}\"\n"
                     for name, text in (records or {}).items())
    pulls = "".join(f"if [ -f \"$d/{name}\" ]; then echo '{RECORD_MARK}{name}'; cat \"$d/{name}\"; echo; fi\n"
                    for name in SHARED_RECORDS)
    return f"""set -e
exec 2>&1
d={shlex.quote(directory)}
mkdir -p "$d" && chmod 700 "$d"
exec 9>"$d/.lock"
flock -w {SCRIPT_TIMEOUT_SECONDS // 2} 9
now=$(date +%s)
token= beat=0
if [ -s "$d/lease" ]; then read -r token beat < "$d/lease" || true; fi
ours={shlex.quote(holder.token)}
if [ {action} = take ]; then
  if [ -n "$token" ] && [ "$token" != "$ours" ] && [ "$token" != {shlex.quote(breaking or '-')} ] && \\
     [ $((now - beat)) -le {STALE_SECONDS} ]; then
    echo "held $((now - beat))"; sed -n 2p "$d/lease"; exit 0
  fi
elif [ "$token" != "$ours" ]; then
  echo lost; if [ -s "$d/lease" ]; then sed -n 2p "$d/lease"; fi; exit 0
fi
{writes}if [ {action} = release ]; then rm -f "$d/lease"; echo released; exit 0; fi
printf '%s %s\\n%s\\n' "$ours" "$now" {shlex.quote(json.dumps(asdict(holder)))} > "$d/.lease.new"
mv "$d/.lease.new" "$d/lease"
if [ {action} = take ]; then echo taken; {pulls.strip().replace(chr(10), '; ')}; else echo renewed; fi
"""


def pulled_records(output: str) -> dict[str, str]:
    """{record name: its text} from a `take` script's output."""
    records: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines()[1:]:
        if line.startswith(RECORD_MARK):
            current = records.setdefault(line[len(RECORD_MARK):], [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip() + "\n" for name, lines in records.items()}


def describe_holder(line: str, age: str | None) -> str:
    """`root@ctl2: a rollout of deploys/serve.py (pid 4711) since ..., last heartbeat 3s ago`."""
    try:
        holder = Holder(**json.loads(line))
    except (ValueError, TypeError):
        return "another run (its lease cannot be read)"
    heartbeat = f", last heartbeat {age}s ago" if age is not None else ""
    return f"{holder.who}: {holder.what} (pid {holder.pid}) since {holder.since}{heartbeat}"


class FleetLease:
    """The lease on one fleet, held by this run; the records of `state` shared through it."""

    def __init__(self, host: str, data: Mapping[str, Any], state: FleetState, what: str):
        self.host, self.data, self.state = host, data, state
        self.holder = Holder.this_run(what)
        self.pushed: dict[str, str] = {}  # what the fleet has of each record, as last seen or pushed
        self.lock = threading.Lock()  # one script at a time: a heartbeat never passes a push
        self.stopped = threading.Event()
        self.heartbeat: threading.Thread | None = None
        self.problem: str | None = None  # set when a heartbeat found the lease lost
        self.withholding: set[str] = set()  # records not pushed while they are being changed

    @property
    def token(self) -> str:
        return self.holder.token

    def run(self, action: str, records: Mapping[str, str] | None = None, breaking: str = "") -> list[str]:
        """The script's output lines; a lease host that cannot run it is a FleetError naming it and why."""
        script = lease_script(action, self.holder, records, breaking)
        try:
            result = remote.run_script(self.host, self.data, script, timeout=SCRIPT_TIMEOUT_SECONDS)
        except (OSError, FleetError) as exc:
            why = str(exc)
        else:
            if result.status == 0 and result.output.strip():
                return result.output.splitlines()
            why = result.output.strip().splitlines()[-1] if result.output.strip() else f"exit {result.status}"
        raise FleetError(f"the fleet lease on gateway {self.host} ({FLEET_LEASE_DIR}) cannot be {DONE[action]}: {why}; "
                         "every run that changes the fleet takes it there: bring the gateway back, then run again")

    def take(self) -> None:
        """Take the lease and the fleet's records, or refuse naming who holds it."""
        lines = self.run("take")
        if lines[0].startswith("held") and len(lines) > 1:
            holder = json.loads(lines[1]) if lines[1].startswith("{") else {}
            if holder and Holder(**holder).ended():
                lines = self.run("take", breaking=holder["token"])
        if not lines[0].startswith("taken"):
            age = lines[0].split()[1] if len(lines[0].split()) > 1 else None
            raise FleetError(f"the fleet is held by {describe_holder(lines[1] if len(lines) > 1 else '', age)} "
                             f"(lease on gateway {self.host}); wait for it to end: a lease whose holder crashed "
                             f"is free {STALE_SECONDS}s after its last heartbeat")
        for name, text in pulled_records("\n".join(lines)).items():
            self.state.replace_record(name, text)
            self.pushed[name] = text

    @contextmanager
    def withheld(self, name: str):
        """The record is not pushed while the block runs: what it says is not so until the block ends
        (a drained set the routes deploy is applying)."""
        self.withholding.add(name)
        try:
            yield
        finally:
            self.withholding.discard(name)

    def changed_records(self) -> dict[str, str]:
        local = {name: text for name in SHARED_RECORDS
                 if name not in self.withholding and (text := self.state.record_text(name)) is not None}
        return {name: text for name, text in local.items() if self.pushed.get(name) != text}

    def push(self) -> None:
        """Renew the lease with the records that changed since the fleet last had them."""
        with self.lock:
            records = self.changed_records()
            lines = self.run("renew", records)
            if lines[0] != "renewed":
                self.problem = (f"the fleet lease on gateway {self.host} was taken over by "
                                f"{describe_holder(lines[1] if len(lines) > 1 else '', None)}")
                raise FleetError(f"{self.problem}; this run stops changing the fleet")
            self.pushed.update(records)

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self.stopped.wait(HEARTBEAT_SECONDS):
                try:
                    self.push()
                except FleetError:
                    pass  # the next beat tries again; a lease taken over is kept in self.problem
        self.heartbeat = threading.Thread(target=beat, name="fleet-lease-heartbeat", daemon=True)
        self.heartbeat.start()

    def release(self) -> None:
        """Push the records and give the lease back (once; a lease another run took is left to it)."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        with self.lock:
            self.run("release", self.changed_records())


_HELD: list[FleetLease] = []  # the lease this process holds (holding()): one at most


def held() -> FleetLease | None:
    """The lease this process holds, whose token its pyinfra runs carry (rollout.run_child)."""
    return _HELD[-1] if _HELD else None


@contextmanager
def holding(host: str, data: Mapping[str, Any], state: FleetState, what: str):
    """The fleet's lease for as long as the block runs, renewed by a heartbeat; yields it."""
    lease = FleetLease(host, data, state, what)
    lease.take()
    lease.start_heartbeat()
    _HELD.append(lease)
    try:
        yield lease
    finally:
        _HELD.remove(lease)
        release_at_exit(lease)


def lease_of_deploy(inventory: Inventory, deploy_files: tuple[str, ...]) -> FleetLease | None:
    """For a plain deploy run (fleet_check.check_before_connecting): the lease it must hold until it exits,
    taken, or None when it needs none (a rollout's child, a deploy that changes nothing that serves, a
    fleet without a gateway)."""
    if os.environ.get(LEASE_ENV) or not any(Path(f).name in LEASED_DEPLOYS for f in deploy_files):
        return None
    # The validated data's gateways, as every stage's: `gateway = {}` is a gateway of the defaults.
    gateway = next((host for host in inventory if host_node_config(host).is_gateway), None)
    if gateway is None:
        return None
    state_dir = host_node_config(gateway).fleet_state_dir
    lease = FleetLease(gateway.name, gateway.data.dict(), FleetState(state_dir), f"pyinfra {' '.join(deploy_files)}")
    lease.take()
    lease.start_heartbeat()
    atexit.register(release_at_exit, lease)
    return lease


def release_at_exit(lease: FleetLease) -> None:
    """The lease back as its run ends; a gateway gone by then is said in one line (the lease goes stale,
    the fleet's records miss what changed since the last heartbeat)."""
    try:
        lease.release()
    except FleetError as exc:
        print(f"warning: {exc}", file=sys.stderr)
