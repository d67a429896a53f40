"""Running commands on the lab's host machine."""

from __future__ import annotations

import subprocess

from ascend_fleet.core.errors import FleetError


def run(argv: list[str], *, check: bool = True, what: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run argv; on failure raise one line with the command's own last error line."""
    if "input" not in kwargs:
        kwargs["stdin"] = subprocess.DEVNULL
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise FleetError(f"lab: {what or ' '.join(argv[:3])} failed (exit {result.returncode}): {detail[0]}")
    return result


def quiet(argv: list[str]) -> bool:
    """Run argv for its exit status only: teardown steps that may find nothing to remove."""
    return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL).returncode == 0
