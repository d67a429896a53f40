"""The weights stage spreading a model over the fleet (model.peers): a worker killed mid-transfer
does not stop the others and resumes without fetching its verified files again; a corrupt copy
on a peer is refused and never passed on.

Every run is the real weights deploy, `pyinfra -vvv inventories/lab.py deploys/weights.py`, with
`--data model=...` naming lab/Spread, a synthetic model of many small shards on the lab mirror.
Each worker's nginx logs what it served its peers in ASCEND_FLEET_WEIGHTS_LOG; the mirror logs
what the origin served.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from ascend_fleet.core.model_tree import publish_model
from ascend_fleet.core.node_layout import MANIFEST_NAME, PEER_SERVER_LOG
from ascend_fleet.lab.lab import ssh_argv
from ascend_fleet.lab.nodes import node_dir
from ascend_fleet.lab.shaping import clear_links, limit_links
from ascend_fleet.lab.sim.tinymodel import build_tiny_model
from ascend_fleet.lab.state import LabState
from tests.lab.conftest import BIN, PROJECT

pytestmark = pytest.mark.lab

MODEL = "lab/Spread"
MODEL_DIR = "/mnt/nvme/models"
WEIGHTS_LOG = PEER_SERVER_LOG
# 24 shards of 2 MB over 16 Mbit/s links: a worker needs about 25 s, time enough to kill one midway.
SIZE_MB, SHARDS, RATE_MBIT = 48, 24, 16
GET_LINE = re.compile(r'^(\S+) .*"GET (\S+) HTTP/[\d.]+" (\d{3})', re.MULTILINE)


@pytest.fixture(scope="module")
def spread_model(lab, tmp_path_factory):
    """lab/Spread v1 and v2 on the mirror (same bytes, two revisions), nothing of it on the workers;
    afterwards the workers' copies are gone."""
    built = build_tiny_model(tmp_path_factory.mktemp("spread"), name=MODEL, size_mb=SIZE_MB, num_shards=SHARDS,
                             max_shard_mb=SIZE_MB / SHARDS)
    models = lab.lab_dir / "mirror" / "models"
    publish_model(built, models)
    manifest = json.loads((built / MANIFEST_NAME).read_text())
    (built / MANIFEST_NAME).write_text(json.dumps({**manifest, "revision": "v2"}))
    publish_model(built, models)
    empty_workers(lab)
    yield {name: entry["sha256"] for name, entry in manifest["files"].items()}
    empty_workers(lab)


def empty_workers(lab) -> None:
    for worker in lab.workers:
        lab.run(worker, f"rm -rf {MODEL_DIR}/{MODEL} {MODEL_DIR}/.partial/{MODEL}")


def stage_argv(revision: str, hosts: list[str]) -> list[str]:
    model = {"id": MODEL, "revision": revision, "source": "http", "peers": True}
    argv = [str(BIN / "pyinfra"), "-y", "-vvv", "inventories/lab.py", "deploys/weights.py",
            "--data", f"model={json.dumps(model)}"]
    return argv + [word for host in hosts for word in ("--limit", host)]


def stage(lab, revision: str, hosts: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(stage_argv(revision, hosts), env=lab.env, cwd=PROJECT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


def sha256s(lab, worker: str, directory: str) -> dict[str, str]:
    out = lab.run(worker, f"cd {directory} && find . -type f ! -name '.*' -printf '%P\\0' | xargs -0 sha256sum").stdout
    return {name: digest for digest, name in (line.split(None, 1) for line in out.splitlines())}


def verified_files(lab, worker: str, revision: str) -> set[str]:
    """What the worker's stager has verified so far (the partial directory less .incoming)."""
    node = LabState.require(lab.lab_dir).spec.node(worker)
    out = subprocess.run([*ssh_argv(lab.lab_dir, node), f"ls -A {MODEL_DIR}/.partial/{MODEL}/{revision} || true"],
                         capture_output=True, text=True, timeout=60).stdout
    return {name for name in out.split() if not name.startswith(".")}


def log_size(lab, node: str) -> int:
    return int(lab.run(node, f"stat -c %s {WEIGHTS_LOG} 2>/dev/null || echo 0").stdout)


def served_since(lab, node: str, since: int) -> list[tuple[str, str, int]]:
    """(client address, file name, status) of the GETs a worker's weights server answered past byte `since`."""
    out = lab.run(node, f"tail -c +{since + 1} {WEIGHTS_LOG} 2>/dev/null || true").stdout
    return [(client, path.rsplit("/", 1)[1], int(status)) for client, path, status in GET_LINE.findall(out)
            if not path.endswith("/")]


def origin_served_since(lab, since: int, revision: str) -> list[tuple[str, str]]:
    log = (lab.lab_dir / "mirror" / "run" / "access.log").read_text()[since:]
    prefix = f"/models/{MODEL}/{revision}/"
    return [(client, path[len(prefix):]) for client, path, _ in GET_LINE.findall(log) if path.startswith(prefix)]


def wait_for_ssh(lab, node: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while lab.run(node, "true", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{node} booted but sshd did not answer in {timeout:.0f}s"
        time.sleep(1)


def address(lab, worker: str) -> str:
    return next(node["address"] for node in lab.status()["nodes"] if node["name"] == worker)


def test_a_worker_killed_mid_transfer_leaves_the_others_finishing_and_resumes_what_it_lacks(
        lab, spread_model, tmp_path):
    victim, others = "worker2", ["worker1", "worker3"]
    log = tmp_path / "pyinfra.log"  # a file, not a pipe: -vvv would fill a pipe nobody reads meanwhile
    links = LabState.require(lab.lab_dir).spec
    with log.open("w") as out:
        run = subprocess.Popen(stage_argv("v1", lab.workers), env=lab.env, cwd=PROJECT, stdout=out,
                               stderr=subprocess.STDOUT)
    hold = node_dir(lab.lab_dir, victim) / "hold"
    try:
        deadline = time.monotonic() + 600
        while "files already verified" not in log.read_text():  # nginx installed, the stagers begin
            assert time.monotonic() < deadline and run.poll() is None, "the stagers never started"
            time.sleep(0.2)
        limit_links(links, RATE_MBIT)  # slow enough to kill the victim midway
        while len([name for name in verified_files(lab, victim, "v1") if name.endswith(".safetensors")]) < 2:
            assert time.monotonic() < deadline and run.poll() is None, "the victim never got going"
            time.sleep(0.2)
        hold.touch()
        # A power cut, at once: straight over ssh (the CLI's start-up would give the victim seconds more).
        subprocess.run([*ssh_argv(lab.lab_dir, links.node(victim)), "systemctl reboot --force --force"],
                       capture_output=True, timeout=30)
        run.wait(timeout=600)
        output = log.read_text()
    except BaseException:
        run.kill()
        hold.unlink(missing_ok=True)  # the node comes back for the tests after this one
        raise
    finally:
        clear_links(links)

    assert run.returncode != 0  # the victim's part failed...
    for worker in others:  # ...the others finished, every file verified
        assert f"[{worker}] published {MODEL_DIR}/{MODEL}/v1 in" in output, output[-4000:]
        assert sha256s(lab, worker, f"{MODEL_DIR}/{MODEL}/v1") == spread_model

    hold.unlink()
    lab.wait_running(victim, timeout=180)
    wait_for_ssh(lab, victim)
    kept = verified_files(lab, victim, "v1")
    assert 2 <= len(kept) < len(spread_model), kept  # mid-transfer: some shards verified, not all
    peers_before = {worker: log_size(lab, worker) for worker in others}
    origin_before = (lab.lab_dir / "mirror" / "run" / "access.log").stat().st_size

    rerun = stage(lab, "v1", [victim])

    assert rerun.returncode == 0, rerun.stdout[-4000:]
    assert f"[{victim}] {len(kept)} of {len(spread_model)} files already verified" in rerun.stdout
    assert f"[{victim}] fetched {len(spread_model) - len(kept)} files: " in rerun.stdout
    assert sha256s(lab, victim, f"{MODEL_DIR}/{MODEL}/v1") == spread_model
    me = address(lab, victim)
    fetched_again = [name for worker in others for client, name, _ in served_since(lab, worker, peers_before[worker])
                     if client == me and name in kept]
    fetched_again += [name for client, name in origin_served_since(lab, origin_before, "v1")
                      if client == me and name in kept]
    assert fetched_again == []
    from_peers = [name for worker in others for client, name, status in
                  served_since(lab, worker, peers_before[worker]) if client == me and status in (200, 206)]
    assert set(from_peers) >= set(spread_model) - kept  # the rest came from its peers


def test_a_corrupt_copy_on_a_peer_is_refused_and_never_passed_on(lab, spread_model):
    source, pullers = "worker1", ["worker2", "worker3"]
    seeded = stage(lab, "v2", [source])
    assert seeded.returncode == 0, seeded.stdout[-4000:]
    shard = sorted(name for name in spread_model if name.endswith(".safetensors"))[len(spread_model) // 3]
    # Bit rot under a published revision: same size, so the marker still says staged.
    lab.run(source, "python3 -c 'import sys; f = open(sys.argv[1], \"r+b\"); f.seek(4096); b = f.read(1); "
                    f"f.seek(4096); f.write(bytes([b[0] ^ 255]))' {MODEL_DIR}/{MODEL}/v2/{shard}")
    assert sha256s(lab, source, f"{MODEL_DIR}/{MODEL}/v2")[shard] != spread_model[shard]
    before = {worker: log_size(lab, worker) for worker in lab.workers}

    result = stage(lab, "v2", pullers)

    assert result.returncode == 0, result.stdout[-4000:]
    for worker in pullers:
        assert sha256s(lab, worker, f"{MODEL_DIR}/{MODEL}/v2") == spread_model
    refusals = re.findall(r"^\s*\[(\S+)\] refused (\S+) from http://([\d.]+):\d+: it sha256", result.stdout,
                          re.MULTILINE)
    assert refusals, result.stdout[-4000:]
    assert {(name, peer) for _, name, peer in refusals} == {(shard, address(lab, source))}  # only worker1's copy
    served_by_source = [(client, name) for client, name, status in served_since(lab, source, before[source])
                        if name == shard and status == 200]
    assert {client for client, _ in served_by_source} >= {address(lab, w) for w, *_ in refusals}
