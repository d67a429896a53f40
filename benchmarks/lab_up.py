"""Benchmark: how long `ascend-fleet lab up` takes for 3 workers + a gateway with warm caches.

Target (issue 2): under a minute on a 2-core machine. The first round also warms the
caches (Debian base, wheelhouse, model) if they are cold; it is reported apart.

    sudo .venv/bin/python benchmarks/lab_up.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLI = str(Path(sys.executable).parent / "ascend-fleet")
LAB = ["--name", "bench", "--subnet", "10.213.90.0/24"]
ENV = {**os.environ, "ASCEND_FLEET_LAB_DIR": "/var/lib/ascend-fleet/bench-lab"}


def timed_up() -> float:
    started = time.monotonic()
    subprocess.run([CLI, "lab", "up", "--nodes", "3", *LAB], env=ENV, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    subprocess.run([CLI, "lab", "down"], env=ENV, check=True, capture_output=True)
    times = []
    for _ in range(rounds + 1):
        times.append(timed_up())
        subprocess.run([CLI, "lab", "down"], env=ENV, check=True, capture_output=True)
    warm = times[1:]
    print(f"lab up, 3 workers + gateway: first (cache warming) {times[0]:.1f}s; warm rounds "
          f"{', '.join(f'{t:.1f}s' for t in warm)}; median {statistics.median(warm):.1f}s (target < 60s)")


if __name__ == "__main__":
    main()
