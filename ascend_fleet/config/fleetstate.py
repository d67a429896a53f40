"""What the fleet's control machines remember about it between runs: each keeps a copy in its
`fleet_state_dir`, and the fleet keeps the one they share beside its lease (fleetlease.py): a run that
takes the lease first gets the fleet's records, and the fleet gets them back while it holds it.

- `gateway.json`: the instances the gateway must keep out of rotation (`drained`, as
  `host/instance`), and which colour of instances each worker serves with (`colours`,
  blue unless recorded; a blue/green swap flips it). Every deploy reads it (the gateway
  stage, and host_config.host_node_config for the instances), so a plain
  `pyinfra INVENTORY deploys/full.py` never puts back an instance a stopped rollout
  left drained, nor starts the colour a swap stopped.
- `served` in `gateway.json`: per worker, the instances that passed their gate since they last
  (re)started. The gateway routes only to those, so an instance that never served (its host
  refused, its start failed) is never a backend. A worker with no entry has not been deployed
  since this was kept: all its instances count, as before.
- `rollout.json`: the steps of the last rollout or model swap and how far it got, so
  `--resume` continues at the step that failed (or `--abandon` puts back what it drained).
- `tune.json`: the last tune's candidates, their results and whether its canary is back as its
  data says, so `tune --resume` finishes it (tune.py).
- The lease of the one rollout, swap, abandon, tune or plain deploy changing the fleet is on the fleet
  (fleetlease.py), not here.

The directory comes from host data (`fleet_state_dir`, relative to the directory pyinfra
runs in, like group_data/); the lab points it into its own directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ascend_fleet.core.errors import FleetError, InputError, visible

GATEWAY_FILE = "gateway.json"
ROLLOUT_FILE = "rollout.json"
TUNE_FILE = "tune.json"
SHARED_RECORDS = (GATEWAY_FILE, ROLLOUT_FILE, TUNE_FILE)  # what every control machine must see alike
BLUE, GREEN = "blue", "green"
COLOURS = (BLUE, GREEN)


def other_colour(colour: str) -> str:
    return GREEN if colour == BLUE else BLUE


def backend_key(host: str, instance: str) -> str:
    return f"{host}/{instance}"


def split_backend_key(target: str, option: str, whole_host: bool = True) -> tuple[str, str | None]:
    """An instance as an operator names it, HOST/INSTANCE (or HOST alone, every instance it serves, where
    `whole_host`): (host, instance or None). A part left empty is refused in one line naming `option`:
    `HOST/` would otherwise name every instance of the host."""
    host, slash, instance = target.partition("/")
    if not host.strip() or (slash or not whole_host) and not instance.strip() or "/" in instance:
        alone = "HOST (every instance it serves) or " if whole_host else ""
        raise InputError(f"{option} {visible(target)}: expected {alone}HOST/INSTANCE, both parts given, e.g. "
                         "worker2/vllm-1")
    return host, instance or None


def counts_as_served(served: dict[str, set[str]], host: str, instance: str) -> bool:
    """Whether the gateway may route to the instance by the served record (FleetState.served()):
    it is in its worker's record, or its worker has no record yet (deployed before it was kept)."""
    return host not in served or instance in served[host]


class FleetState:
    def __init__(self, directory: Path | str):
        self.directory = Path(directory)

    def drained(self) -> set[str]:
        return set(self._read(GATEWAY_FILE, {}).get("drained", []))

    def set_drained(self, keys: set[str]) -> None:
        self._write(GATEWAY_FILE, {**self._read(GATEWAY_FILE, {}), "drained": sorted(keys)})

    def colours(self) -> dict[str, str]:
        """Each worker's recorded colour; a worker missing serves blue. A colour that is none (the file edited by
        hand) is refused naming the file, not met as the host's `colour` key, which its data does not have."""
        colours = self._read(GATEWAY_FILE, {}).get("colours", {})
        for host, colour in colours.items():
            if colour not in COLOURS:
                raise FleetError(f"{self.directory / GATEWAY_FILE}: colours.{host}: {visible(colour)} is not a colour; "
                                 f"expected {' or '.join(COLOURS)} (the set that serves on {host}): correct the file")
        return colours

    def set_colours(self, colours: dict[str, str]) -> None:
        document = self._read(GATEWAY_FILE, {})
        self._write(GATEWAY_FILE, {**document, "colours": {**document.get("colours", {}), **colours}})

    def served(self) -> dict[str, set[str]]:
        """Instances that served, by worker; a worker missing has no record (see the module's doc)."""
        return {host: set(names) for host, names in self._read(GATEWAY_FILE, {}).get("served", {}).items()}

    def set_served(self, host: str, names: set[str]) -> None:
        document = self._read(GATEWAY_FILE, {})
        self._write(GATEWAY_FILE, {**document, "served": {**document.get("served", {}), host: sorted(names)}})

    def rollout(self) -> dict | None:
        return self._read(ROLLOUT_FILE, None)

    def save_rollout(self, record: dict) -> None:
        self._write(ROLLOUT_FILE, record)

    def tune(self) -> dict | None:
        return self._read(TUNE_FILE, None)

    def save_tune(self, record: dict) -> None:
        self._write(TUNE_FILE, record)

    def record_text(self, name: str) -> str | None:
        """A record as its file holds it, or None when there is none."""
        try:
            return (self.directory / name).read_text()
        except FileNotFoundError:
            return None

    def replace_record(self, name: str, text: str) -> None:
        """A record as another control machine left it on the fleet (fleetlease.py)."""
        self._write(name, json.loads(text))

    def _read(self, name: str, default):
        try:
            return json.loads((self.directory / name).read_text())
        except FileNotFoundError:
            return default

    def _write(self, name: str, document) -> None:
        """Atomically: a rollout interrupted mid-write leaves the previous state, never half a file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.directory / f".{name}.{os.getpid()}"
        partial.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(partial, self.directory / name)
