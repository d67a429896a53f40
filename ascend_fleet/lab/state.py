"""The lab's state file: its spec, and a journal of everything it created.

Each resource is recorded *before* it is created, so `lab down` can undo a lab
whose `lab up` crashed halfway: removing something that was never made is a no-op.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ascend_fleet.core.errors import FleetError
from ascend_fleet.lab.spec import DEFAULT_LAB_DIR, LabSpec

STATE_FILE = "state.json"


class LabState:
    def __init__(self, lab_dir: Path, spec: dict | None, resources: list[dict]):
        self.lab_dir = lab_dir
        self.spec_data = spec
        self.resources = resources

    @property
    def path(self) -> Path:
        return self.lab_dir / STATE_FILE

    @property
    def spec(self) -> LabSpec:
        if self.spec_data is None:
            raise FleetError(f"lab: {self.path} records no lab spec; run `ascend-fleet lab down` and `lab up` again")
        return LabSpec.model_validate(self.spec_data)

    @classmethod
    def load(cls, lab_dir: Path = DEFAULT_LAB_DIR) -> LabState | None:
        path = lab_dir / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise FleetError(f"lab: cannot read {path} ({exc}); remove it by hand after checking "
                             "`ip netns`, `mount` and `ps` for leftovers") from None
        return cls(lab_dir, data.get("spec"), data.get("resources", []))

    @classmethod
    def require(cls, lab_dir: Path = DEFAULT_LAB_DIR) -> LabState:
        state = cls.load(lab_dir)
        if state is None:
            raise FleetError(f"lab: no lab is up (no {lab_dir / STATE_FILE}); run `ascend-fleet lab up`")
        return state

    def record(self, kind: str, **attributes) -> dict:
        """Journal a resource about to be created and return its entry (update it, then `save`)."""
        entry = {"kind": kind, **attributes}
        self.resources.append(entry)
        self.save()
        return entry

    def find(self, kind: str, **match) -> list[dict]:
        return [r for r in self.resources if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())]

    def save(self) -> None:
        self.lab_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"spec": self.spec_data, "resources": self.resources}, indent=2, default=str))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
