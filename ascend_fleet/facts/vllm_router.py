"""Facts about a gateway's vllm-router.

.. code:: python

    from ascend_fleet.facts.vllm_router import RouterWorkers
"""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase
from typing_extensions import override

# Asks the router on loopback for its workers until it answers or the wait is over: it listens once it has
# started (a second or so), or once one of the workers it starts with answers /health.
PROBE = """
import sys, time, urllib.request
port, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/list_workers", timeout=2) as answer:
            print("answers", answer.read().decode())
            break
    except Exception as error:
        if time.monotonic() > deadline:
            print("silent", getattr(error, "reason", error))
            break
        time.sleep(0.5)
"""


class RouterWorkers(FactBase[dict]):
    """
    What the gateway's vllm-router answers on loopback for its workers, asked with the gateway's python3 for
    up to wait_seconds:

    .. code:: python

        {"workers": ["http://10.0.0.2:8000"]}  # or {"problem": "[Errno 111] Connection refused"}
    """

    @override
    def command(self, port: int, wait_seconds: float) -> str:
        return f"python3 -c {shlex.quote(PROBE)} {int(port)} {float(wait_seconds)}"

    @override
    def process(self, output: list[str]) -> dict:
        verdict, _, rest = " ".join(output).partition(" ")
        if verdict == "answers":
            try:
                return {"workers": list(json.loads(rest)["urls"])}
            except (ValueError, KeyError, TypeError):
                return {"problem": f"/list_workers answered {rest[:200]!r}"}
        return {"problem": rest or "no answer"}
