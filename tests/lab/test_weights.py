"""weights.staged through pyinfra on lab workers: stage, converge, resume, refuse, and leave served weights alone.

Every run is `pyinfra -y inventories/lab.py tests/lab/deploys/weights.py` with the lab
mirror's URL and a revision in --data. The mirror gets lab/Qwen3-Tiny as v1 (unless
the lab already published it) and v2, plus two broken revisions: `corrupt` (a shard
altered after its manifest was written) and `huge` (a manifest claiming more than the
8 GB NVMe holds).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ascend_fleet.core.model_tree import publish_model
from ascend_fleet.core.node_layout import MANIFEST_NAME, MARKER_NAME
from ascend_fleet.lab.sim.tinymodel import build_tiny_model

pytestmark = pytest.mark.lab

DEPLOY = "tests/lab/deploys/weights.py"
MODEL = "lab/Qwen3-Tiny"
MODEL_DIR = "/mnt/nvme/models"
SHARD_1, SHARD_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
HUGE_SHARD_BYTES = 20 * 1024**3


def revision_path(revision: str) -> str:
    return f"{MODEL_DIR}/{MODEL}/{revision}"


def partial_path(revision: str) -> str:
    return f"{MODEL_DIR}/.partial/{MODEL}/{revision}"


def publish_revision(built: Path, models: Path, revision: str, work: Path, edit=None) -> Path:
    """Publish the built model under another revision name, its manifest optionally edited."""
    copy = work / revision
    shutil.copytree(built, copy)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["revision"] = revision
    if edit:
        edit(manifest)
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
    return publish_model(copy, models)


def claim_huge_shard(manifest: dict) -> None:
    manifest["files"][SHARD_1]["size"] = HUGE_SHARD_BYTES


def flip_one_byte(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


@pytest.fixture(scope="module")
def mirror(lab, tmp_path_factory):
    """The revisions these tests stage, on the lab mirror; every worker's models directory emptied."""
    models = lab.lab_dir / "mirror" / "models"
    built = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    work = tmp_path_factory.mktemp("revisions")
    if not (models / MODEL / "v1" / MANIFEST_NAME).exists():  # `lab up` may already publish it
        publish_model(built, models)
    publish_revision(built, models, "v2", work)
    flip_one_byte(publish_revision(built, models, "corrupt", work) / SHARD_1)
    publish_revision(built, models, "huge", work, edit=claim_huge_shard)
    for worker in lab.workers:
        lab.run(worker, f"rm -rf {MODEL_DIR}")
    return models


def stage(lab, *, limit: str = "workers", revision: str = "v1", check: bool = True):
    model = json.dumps({"id": "lab/Qwen3-Tiny", "revision": revision, "source": "http"})
    return lab.pyinfra(DEPLOY, "--limit", limit, "--data", f"model={model}", check=check)


def unstaged(lab, node: str, revision: str) -> None:
    """Nothing of the revision on the node, staged or partial (another test may have staged it)."""
    lab.run(node, f"rm -rf {revision_path(revision)} {partial_path(revision)}")


def change_counts(output: str) -> dict[str, int]:
    """pyinfra's own results row for the stage operation: hosts changed, errored, unchanged."""
    row = re.search(r"Stage lab/Qwen3-Tiny\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert row, output[-3000:]
    return dict(zip(("success", "error", "no_change"), (0 if v == "-" else int(v) for v in row.groups()[1:])))


def mirror_requests(lab, revision: str, since: int) -> list[tuple[str, int, str]]:
    """(file, HTTP status) of the nodes' GETs for a revision from the mirror, from its access.log past byte
    `since`. The control machine's own (the check before connecting reads the model's config.json to plan
    with) come from the mirror's address and are left out."""
    log = (lab.lab_dir / "mirror" / "run" / "access.log").read_text()[since:]
    prefix, control = f"/models/{MODEL}/{revision}/", urlsplit(lab.mirror_url).hostname
    return [(path[len(prefix):], int(status)) for client, path, status in
            re.findall(r'^(\S+) .*"GET (\S+) HTTP/[\d.]+" (\d{3})', log, re.M)
            if path.startswith(prefix) and client != control]


def access_log_size(lab) -> int:
    return (lab.lab_dir / "mirror" / "run" / "access.log").stat().st_size


def sha256_on_node(lab, node: str, directory: str) -> dict[str, str]:
    out = lab.run(node, f"cd {directory} && sha256sum -- * | sort -k2").stdout
    return {name: digest for digest, name in (line.split(None, 1) for line in out.splitlines())}


def listing(lab, node: str, directory: str) -> str:
    return lab.run(node, f"ls -A {directory} 2>/dev/null || true").stdout


def stat_on_node(lab, node: str, directory: str) -> str:
    return lab.run(node, f"cd {directory} && stat -c '%n %i %s %Y' -- {MARKER_NAME} *").stdout


def test_first_run_stages_every_worker_and_the_second_changes_nothing(lab, mirror):
    for worker in lab.workers:
        unstaged(lab, worker, "v1")
    first = stage(lab)
    assert change_counts(first.stdout) == {"success": 3, "error": 0, "no_change": 0}

    manifest = json.loads((mirror / MODEL / "v1" / MANIFEST_NAME).read_text())
    for worker in lab.workers:
        marker = json.loads(lab.run(worker, f"cat {revision_path('v1')}/{MARKER_NAME}").stdout)
        assert (marker["model_id"], marker["revision"]) == (MODEL, "v1")
        assert marker["files"] == manifest["files"]
        on_node = sha256_on_node(lab, worker, revision_path("v1"))
        assert on_node == {name: entry["sha256"] for name, entry in manifest["files"].items()}
        assert listing(lab, worker, partial_path("v1")) == ""

    second = stage(lab)
    assert change_counts(second.stdout) == {"success": 0, "error": 0, "no_change": 3}


def test_an_interrupted_download_resumes_without_fetching_completed_files_again(lab, mirror):
    # What a download killed midway leaves: finished files, and a shard cut off after 1000 bytes.
    unstaged(lab, "worker1", "v2")
    url = f"{lab.mirror_url}/models/{MODEL}/v2"
    partial = partial_path("v2")
    lab.run("worker1", f"mkdir -p {partial} && cd {partial} && curl -fsS -O {url}/config.json -O {url}/{SHARD_1} "
                       f"&& curl -fsS -r 0-999 -o {SHARD_2} {url}/{SHARD_2}")
    inode_before = lab.run("worker1", f"stat -c %i {partial}/{SHARD_2}").stdout.strip()
    since = access_log_size(lab)

    result = stage(lab, limit="worker1", revision="v2")

    assert change_counts(result.stdout) == {"success": 1, "error": 0, "no_change": 0}
    fetched = mirror_requests(lab, "v2", since)
    assert ("config.json", 200) not in fetched and (SHARD_1, 200) not in fetched
    assert (SHARD_2, 206) in fetched  # a Range request for the rest, not the whole shard
    assert lab.run("worker1", f"stat -c %i {revision_path('v2')}/{SHARD_2}").stdout.strip() == inode_before
    manifest = json.loads((mirror / MODEL / "v2" / MANIFEST_NAME).read_text())
    assert sha256_on_node(lab, "worker1", revision_path("v2")) == {
        name: entry["sha256"] for name, entry in manifest["files"].items()}


def test_a_corrupt_shard_on_the_mirror_is_refused_and_nothing_is_published(lab, mirror):
    result = stage(lab, limit="worker3", revision="corrupt", check=False)

    assert result.returncode != 0
    errors = [line for line in result.stdout.splitlines() if "worker3: weights lab/Qwen3-Tiny@corrupt:" in line]
    assert len(errors) == 1, result.stdout[-3000:]
    assert f"{SHARD_1} sha256" in errors[0] and "does not match the manifest" in errors[0]
    assert "nothing was published" in errors[0]
    assert lab.run("worker3", f"test -e {revision_path('corrupt')}", check=False).returncode != 0
    assert lab.run("worker3", f"test -e {partial_path('corrupt')}/{SHARD_1}", check=False).returncode != 0


def test_an_nvme_too_small_fails_before_downloading_with_one_line(lab, mirror):
    since = access_log_size(lab)

    result = stage(lab, limit="worker3", revision="huge", check=False)

    assert result.returncode != 0
    errors = [line for line in result.stdout.splitlines() if "worker3: weights lab/Qwen3-Tiny@huge: needs" in line]
    assert len(errors) == 1, result.stdout[-3000:]
    needed, free = map(int, re.search(r"needs (\d+) bytes .* only (\d+) are free", errors[0]).groups())
    assert needed > HUGE_SHARD_BYTES > free
    assert [name for name, _ in mirror_requests(lab, "huge", since)] == [MANIFEST_NAME]  # nothing else fetched
    assert listing(lab, "worker3", partial_path("huge")) == ""


def test_a_revision_being_served_is_left_untouched_while_the_next_is_staged(lab, mirror):
    unstaged(lab, "worker2", "v2")
    stage(lab, limit="worker2", revision="v1")
    served = revision_path("v1")
    # Stands in for vLLM: a process holding a shard of v1 open for as long as it serves.
    holder = lab.run("worker2", f"setsid sh -c 'exec 3<{served}/{SHARD_1}; exec sleep 600' "
                                ">/dev/null 2>&1 </dev/null & echo $!").stdout.strip()
    try:
        before = stat_on_node(lab, "worker2", served), sha256_on_node(lab, "worker2", served)

        result = stage(lab, limit="worker2", revision="v2")

        assert change_counts(result.stdout) == {"success": 1, "error": 0, "no_change": 0}
        assert (stat_on_node(lab, "worker2", served), sha256_on_node(lab, "worker2", served)) == before
        held = lab.run("worker2", f"readlink /proc/{holder}/fd/3").stdout.strip()
        assert held == f"{served}/{SHARD_1}"  # still the live file, not "(deleted)"
        assert lab.run("worker2", f"test -f {revision_path('v2')}/{MARKER_NAME}",
                       check=False).returncode == 0
    finally:
        lab.run("worker2", f"kill {holder}", check=False)
