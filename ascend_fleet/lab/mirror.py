"""The lab mirror on the host: Debian proxy, PEP 503 index, vendor files and models, served by nginx."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

from ascend_fleet import TEMPLATES
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.package_index import write_simple_index
from ascend_fleet.core.templating import render
from ascend_fleet.lab import processes
from ascend_fleet.lab.host import run
from ascend_fleet.lab.spec import CACHE_DIR, LabSpec
from ascend_fleet.lab.state import LabState

CONTENT_DIRS = ("files", "simple", "packages", "models", "openeuler")
# Generous: on a loaded 2-core machine nginx can take a while to bind.
START_TIMEOUT_SECONDS = 60


def mirror_root(lab_dir: Path) -> Path:
    return lab_dir / "mirror"


def locks_dir(lab_dir: Path) -> Path:
    """The lab's locks of its profiles against its mirror (removed with the mirror)."""
    return mirror_root(lab_dir) / "locks"


def start_mirror(state: LabState, spec: LabSpec) -> None:
    root = mirror_root(spec.lab_dir)
    run_dir = root / "run"
    state.record("dir", path=str(root))
    for sub in (*CONTENT_DIRS, "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    apt_cache = CACHE_DIR / "debian-proxy"
    apt_cache.mkdir(parents=True, exist_ok=True)
    shutil.chown(apt_cache, "www-data", "www-data")
    write_simple_index(root)

    config = run_dir / "nginx.conf"
    config.write_text(render(TEMPLATES / "lab" / "mirror-nginx.conf.j2", lab_name=spec.name, run_dir=run_dir,
                             root=root, apt_cache_dir=apt_cache, listen_address=spec.host_address,
                             port=spec.mirror_port, debian_upstream=spec.debian_upstream))
    run(["nginx", "-t", "-q", "-c", str(config)], what="checking the mirror's nginx config")
    entry = state.record("process", role="mirror", marker=str(config), pid=None, log=str(run_dir / "nginx.out"))
    entry["pid"] = processes.spawn(["nginx", "-c", str(config)], run_dir / "nginx.out")
    state.save()
    wait_for_port(spec.host_address, spec.mirror_port, entry["pid"], run_dir)


def wait_for_port(address: str, port: int, pid: int, run_dir: Path) -> None:
    """Until the mirror's nginx (pid, this process's child) listens; its exit or a timeout is refused."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        # Asked of the child itself, not of its command line, which nginx rewrites as it starts.
        if (how := processes.child_exit(pid)) is not None:
            break
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    else:
        how = f"not listening after {START_TIMEOUT_SECONDS} s"
    # Quoted: a lab up that fails removes the mirror's directory, its logs with it.
    raise FleetError(f"lab: the mirror did not listen on {address}:{port} (its nginx {how}); its error.log "
                     f"ends: {processes.last_words(run_dir / 'error.log')}; its output: "
                     f"{processes.last_words(run_dir / 'nginx.out')}")
