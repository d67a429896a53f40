"""The node-side weights stager: manifests, safetensors headers, tool command lines, and a whole stage over HTTP."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections import Counter
from pathlib import Path

import pytest

from ascend_fleet.core.model_tree import publish_model
from ascend_fleet.lab.sim.tinymodel import build_tiny_model
from ascend_fleet.node import stage_weights as sw
from ascend_fleet.node.stage_weights import spread as spread_module
from ascend_fleet.node.stage_weights.main import SESSION_GONE_EXIT

SHA = "a" * 64


# ---------------------------------------------------------------- layout and markers


def test_layout_puts_partial_and_published_on_the_same_tree():
    assert sw.revision_dir("/mnt/nvme/models", "Qwen/Qwen3-8B", "v1") == Path("/mnt/nvme/models/Qwen/Qwen3-8B/v1")
    assert sw.partial_dir("/mnt/nvme/models", "Qwen/Qwen3-8B", "v1") == Path(
        "/mnt/nvme/models/.partial/Qwen/Qwen3-8B/v1")


@pytest.mark.parametrize("model_id, revision", [
    ("Qwen3-8B", "v1"), ("Qwen/Qwen3/8B", "v1"), ("Qwen/..", "v1"), ("Qwen/Qwen3-8B", "refs/pr/1"),
    ("Qwen/Qwen3-8B", ".partial"), ("/Qwen3-8B", "v1"), ("Qwen/Qwen3-8B", ""),
])
def test_ids_and_revisions_that_are_not_plain_path_names_are_refused(model_id, revision):
    with pytest.raises(ValueError, match="plain path names"):
        sw.revision_dir("/m", model_id, revision)


def test_marker_problems_name_missing_and_resized_files_and_a_foreign_marker():
    marker = {"model_id": "o/m", "revision": "v1",
              "files": {"a.json": {"size": 3, "sha256": SHA}, "b.safetensors": {"size": 9, "sha256": SHA}}}
    assert sw.marker_problems(marker, {"a.json": 3, "b.safetensors": 9, sw.MARKER_NAME: 50}, "o/m", "v1") == []
    assert sw.marker_problems(marker, {"a.json": 3}, "o/m", "v1") == ["b.safetensors is missing"]
    assert sw.marker_problems(marker, {"a.json": 4, "b.safetensors": 9}, "o/m", "v1") == [
        "a.json is 4 bytes, the marker says 3"]
    assert sw.marker_problems(marker, {"a.json": 3, "b.safetensors": 9}, "o/m", "v2") == [
        "its marker is for o/m@v1"]


# ---------------------------------------------------------------- manifests


def test_mirror_manifest_of_the_tiny_model_parses(tmp_path):
    built = build_tiny_model(tmp_path)
    doc = json.loads((built / sw.MANIFEST_NAME).read_text())
    files = sw.files_from_mirror_manifest(doc, "lab/Qwen3-Tiny", "v1")
    assert sw.INDEX_NAME in files and "model-00001-of-00002.safetensors" in files
    assert all(set(entry) == {"size", "sha256"} for entry in files.values())


@pytest.mark.parametrize("doc, message", [
    ({"model_id": "lab/Other", "revision": "v1", "files": {"a": {"size": 1, "sha256": SHA}}}, "is for lab/Other@v1"),
    ({"model_id": "lab/M", "revision": "v1", "files": {}}, "lists no files"),
    ({"model_id": "lab/M", "revision": "v1", "files": {"a": {"size": -1, "sha256": SHA}}}, "the size -1"),
    ({"model_id": "lab/M", "revision": "v1", "files": {"a": {"size": 1, "sha256": "xyz"}}}, "hex digest"),
    ({"model_id": "lab/M", "revision": "v1", "files": {"a": {"size": 1}}}, "no digest"),
    ({"model_id": "lab/M", "revision": "v1", "files": {"../etc/passwd": {"size": 1, "sha256": SHA}}}, "unusable"),
    ({"model_id": "lab/M", "revision": "v1", "files": {"/abs": {"size": 1, "sha256": SHA}}}, "unusable"),
    ({"model_id": "lab/M", "revision": "v1", "files": {sw.MARKER_NAME: {"size": 1, "sha256": SHA}}}, "unusable"),
])
def test_mirror_manifests_that_could_not_be_verified_or_escape_are_refused(doc, message):
    with pytest.raises(ValueError, match=message):
        sw.files_from_mirror_manifest(doc, "lab/M", "v1")


def test_modelscope_listing_keeps_blobs_with_their_sha256_and_skips_directories():
    doc = {"Code": 200, "Data": {"Files": [
        {"Name": "config.json", "Path": "config.json", "Type": "blob", "Size": 728, "Sha256": SHA.upper()},
        {"Name": "original", "Path": "original", "Type": "tree", "Size": 0, "Sha256": ""},
        {"Name": "params.json", "Path": "original/params.json", "Type": "blob", "Size": 9, "Sha256": "b" * 64},
    ]}}
    assert sw.files_from_modelscope_listing(doc) == {
        "config.json": {"size": 728, "sha256": SHA},
        "original/params.json": {"size": 9, "sha256": "b" * 64},
    }


def test_modelscope_error_answer_is_refused_with_its_message():
    with pytest.raises(ValueError, match="model not found"):
        sw.files_from_modelscope_listing({"Code": 10010205001, "Message": "model not found", "Data": None})


def test_hf_tree_takes_lfs_sha256_for_weights_and_git_blob_ids_for_small_files():
    entries = [
        {"type": "file", "path": "config.json", "size": 728, "oid": "c" * 40},
        {"type": "directory", "path": "original", "size": 0, "oid": "d" * 40},
        {"type": "file", "path": "model-00001-of-00002.safetensors", "size": 3_960_000_000, "oid": "e" * 40,
         "lfs": {"oid": SHA, "size": 3_960_000_000, "pointerSize": 135}},
    ]
    assert sw.files_from_hf_tree(entries) == {
        "config.json": {"size": 728, "git_sha1": "c" * 40},
        "model-00001-of-00002.safetensors": {"size": 3_960_000_000, "sha256": SHA},
    }


def test_hf_pagination_follows_the_next_link_only():
    link = '<https://huggingface.co/api/models/o/m/tree/main?cursor=abc>; rel="next"'
    assert sw.hf_next_page(link) == "https://huggingface.co/api/models/o/m/tree/main?cursor=abc"
    assert sw.hf_next_page('<https://x/prev>; rel="prev"') is None
    assert sw.hf_next_page(None) is None


def test_manifest_sha256_ignores_key_order_but_not_content():
    a = {"x": {"size": 1, "sha256": SHA}, "y": {"size": 2, "sha256": SHA}}
    b = {"y": {"sha256": SHA, "size": 2}, "x": {"sha256": SHA, "size": 1}}
    assert sw.manifest_sha256("o/m", "v1", a) == sw.manifest_sha256("o/m", "v1", b)
    assert sw.manifest_sha256("o/m", "v1", a) != sw.manifest_sha256("o/m", "v2", a)


def test_git_blob_digest_matches_git(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"hello\n")
    # `printf 'hello\n' | git hash-object --stdin`
    assert sw.file_digest(path, {"size": 6, "git_sha1": "x"}) == ("git_sha1", "ce013625030ba8dba906f756967f9e9ca394464a")
    assert sw.file_problem(path, {"size": 6, "sha256": hashlib.sha256(b"hello\n").hexdigest()}) is None
    assert "does not match" in sw.file_problem(path, {"size": 6, "sha256": SHA})
    assert sw.file_problem(path, {"size": 7, "sha256": SHA}) == "is 6 bytes, the manifest says 7"


# ---------------------------------------------------------------- safetensors headers


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def read_header(blob: bytes) -> dict:
    return sw.read_safetensors_header(io.BytesIO(blob), len(blob))


def test_a_real_shard_header_parses(tmp_path):
    shard = build_tiny_model(tmp_path) / "model-00001-of-00002.safetensors"
    with shard.open("rb") as f:
        header = sw.read_safetensors_header(f, shard.stat().st_size)
    assert header["__metadata__"] == {"format": "pt"} and "model.embed_tokens.weight" in header


@pytest.mark.parametrize("blob, message", [
    (b"\x01\x02", "too short"),
    ((10**6).to_bytes(8, "little") + b"{}", "header in a"),
    ((4).to_bytes(8, "little") + b"nope", "not JSON"),
    ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 8]}}, b"1234"), "outside"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [2]}}, b"1234"), "outside"),
])
def test_broken_headers_are_refused_with_what_is_wrong(blob, message):
    with pytest.raises(ValueError, match=message):
        read_header(blob)


def test_header_with_tensors_inside_the_data_parses():
    blob = safetensors_bytes({"__metadata__": {}, "w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, b"1234")
    assert read_header(blob)["w"]["shape"] == [2]


def test_shards_named_by_the_index_must_all_be_in_the_manifest():
    files = {"a.safetensors": {}, "b.safetensors": {}, sw.INDEX_NAME: {}}
    index = {"weight_map": {"x": "a.safetensors", "y": "c.safetensors"}}
    assert sw.shards_to_check(index, files) == (["a.safetensors", "b.safetensors", "c.safetensors"], ["c.safetensors"])
    with pytest.raises(ValueError, match="weight_map"):
        sw.shards_to_check({"weight_map": ["a.safetensors"]}, files)


# ---------------------------------------------------------------- command lines and tokens


def test_tool_command_lines():
    partial = Path("/m/.partial/Qwen/Qwen3-8B/v1")
    assert sw.modelscope_download_argv("Qwen/Qwen3-8B", "v1", partial, ["a.json"]) == [
        "modelscope", "download", "--model", "Qwen/Qwen3-8B", "--revision", "v1",
        "--local_dir", "/m/.partial/Qwen/Qwen3-8B/v1", "a.json"]
    assert sw.hf_download_argv("Qwen/Qwen3-8B", "v1", partial, ["a.json", "b.json"]) == [
        "hf", "download", "Qwen/Qwen3-8B", "a.json", "b.json", "--local-dir", "/m/.partial/Qwen/Qwen3-8B/v1",
        "--revision", "v1"]
    rsync = sw.rsync_argv("root@worker1", Path("/m/Qwen/Qwen3-8B/v1"), partial)
    assert rsync[0] == "rsync" and "--append-verify" in rsync and "--files-from=-" in rsync
    assert rsync[-2:] == ["root@worker1:/m/Qwen/Qwen3-8B/v1/", "/m/.partial/Qwen/Qwen3-8B/v1/"]
    assert "BatchMode=yes" in rsync[rsync.index("-e") + 1]
    assert sw.ssh_cat_argv("worker1", Path("/m/x"))[-3:] == ["cat", "--", "/m/x"]


def job(tmp_path, tokens=None) -> sw.Job:
    return sw.Job("worker1", "Qwen/Qwen3-8B", "v1", tmp_path / "models", tokens or {})


def test_hub_urls():
    ms = sw.ModelScope(sw.Job("w", "Qwen/Qwen3-8B", "v1", Path("/m")), None)
    assert ms.listing_url() == "https://www.modelscope.cn/api/v1/models/Qwen/Qwen3-8B/repo/files?Revision=v1&Recursive=true"
    hf = sw.HuggingFace(sw.Job("w", "Qwen/Qwen3-8B", "v1", Path("/m")), "https://hf-mirror.example/")
    assert hf.listing_url() == "https://hf-mirror.example/api/models/Qwen/Qwen3-8B/tree/v1?recursive=true"


@pytest.mark.parametrize("hub_class, token_name, endpoint, endpoint_env", [
    (sw.ModelScope, "MODELSCOPE_API_TOKEN", "https://ms.internal:8443", {"MODELSCOPE_DOMAIN": "ms.internal:8443"}),
    (sw.HuggingFace, "HF_TOKEN", "https://hf.internal", {"HF_ENDPOINT": "https://hf.internal"}),
])
def test_hub_tokens_travel_in_the_environment_never_the_command_line(
        tmp_path, monkeypatch, hub_class, token_name, endpoint, endpoint_env):
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(argv=argv, env=kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(subprocess, "run", fake_run)
    secret = {"MODELSCOPE_API_TOKEN": "ms-secret", "HF_TOKEN": "hf-secret"}
    hub = hub_class(job(tmp_path, secret), endpoint)
    hub.fetch(["config.json"], tmp_path)
    assert not any("secret" in word for word in seen["argv"])
    assert seen["env"][token_name] == secret[token_name]
    assert {k: seen["env"][k] for k in endpoint_env} == endpoint_env
    other = next(name for name in secret if name != token_name)
    assert seen["env"].get(other) != secret[other]  # each tool gets only its own hub's token
    assert hub.auth_headers() == {"Authorization": f"Bearer {secret[token_name]}"}


def test_tokens_file_is_read_only_when_root_owned_and_private(tmp_path):
    path = tmp_path / "tokens.env"
    path.write_text("# staged by the deploy\nexport HF_TOKEN='hf-1'\nMODELSCOPE_API_TOKEN=\"ms-2\"\nOTHER=x\n")
    path.chmod(0o600)
    if os.geteuid() == 0:
        assert sw.read_tokens_env_file(path) == {"HF_TOKEN": "hf-1", "MODELSCOPE_API_TOKEN": "ms-2"}
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="mode 0600"):
        sw.read_tokens_env_file(path)
    with pytest.raises(FileNotFoundError, match="does not exist: write it"):
        sw.read_tokens_env_file(tmp_path / "absent.env")


def test_a_missing_tool_is_one_line_saying_to_install_it(tmp_path):
    with pytest.raises(sw.StageError, match=r"^worker1: weights Qwen/Qwen3-8B@v1: no-such-tool-x is not installed"):
        sw.run_tool(job(tmp_path), ["no-such-tool-x"])


def test_failing_tool_reports_its_last_words(tmp_path):
    with pytest.raises(sw.StageError, match=r"sh exited 3 \(boom\)"):
        sw.run_tool(job(tmp_path), ["sh", "-c", "echo noise >&2; echo boom >&2; exit 3"])


# ---------------------------------------------------------------- space


def test_space_counts_only_what_is_still_missing(tmp_path):
    partial = tmp_path
    (partial / "a").write_bytes(b"x" * 4)
    (partial / "b").write_bytes(b"x" * 20)  # longer than the manifest says: fetched again, whole
    files = {"a": {"size": 10}, "b": {"size": 5}, "c": {"size": 7}}
    assert sw.bytes_still_to_fetch(files, partial) == 6 + 5 + 7


def test_too_little_space_is_one_line_with_bytes_needed_and_free(tmp_path):
    files = {"model.safetensors": {"size": 10**15, "sha256": SHA}}
    with pytest.raises(sw.StageError) as error:
        sw.check_space(job(tmp_path), files, margin=1024)
    message = str(error.value)
    assert message.startswith("worker1: weights Qwen/Qwen3-8B@v1: needs 1000000000001024 bytes on ")
    assert "are free" in message and "\n" not in message


# ---------------------------------------------------------------- a whole stage against a local HTTP mirror


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The tiny model published in a mirror tree, served over HTTP on loopback (Range requests included)."""
    root = tmp_path_factory.mktemp("mirror")
    publish_model(build_tiny_model(tmp_path_factory.mktemp("built")), root / "models")
    handler = functools.partial(RangeHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """http.server with just enough of RFC 7233 for one `bytes=N-` range; it records what was asked."""

    requests: list[tuple[str, str | None]] = []

    def log_message(self, *args):
        pass

    def list_directory(self, path):
        """A directory as nginx's `autoindex_format json` lists it (dot files left out)."""
        entries = [{"name": entry.name, "type": "directory" if entry.is_dir() else "file",
                    **({} if entry.is_dir() else {"size": entry.stat().st_size})}
                   for entry in sorted(Path(path).iterdir()) if not entry.name.startswith(".")]
        body = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def send_head(self):
        RangeHandler.requests.append((self.path, self.headers.get("Range")))
        wanted = self.headers.get("Range", "")
        path = Path(self.translate_path(self.path))
        size = path.stat().st_size if path.is_file() else 0
        if not wanted.startswith("bytes=") or not size:  # nginx ignores a range of an empty file: 200, no body
            return super().send_head()
        start = int(wanted[len("bytes="):].rstrip("-"))
        if start >= size:  # as nginx answers a range beyond the file
            self.send_error(416)
            return None
        f = path.open("rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        return f


def run_stager(tmp_path, url, revision="v1", margin=0, peers=(), seeders=()) -> tuple[int, str]:
    argv = ["--host", "worker1", "--model-id", "lab/Qwen3-Tiny", "--revision", revision,
            "--model-dir", str(tmp_path / "models"), "--source", "http", "--url", url,
            "--min-free-margin-bytes", str(margin), *(word for peer in peers for word in ("--peer-url", peer)),
            *(word for peer in seeders for word in ("--seeder-url", peer))]
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stderr", err)
        patch.setattr(os, "sync", lambda: None)  # the test's tmp filesystem needs no flush
        code = sw.main(argv)
    return code, err.getvalue()


def test_stage_publishes_verified_files_with_a_marker_and_resumes_a_cut_off_shard(tmp_path, mirror):
    root, url = mirror
    source = root / "models/lab/Qwen3-Tiny/v1"
    partial = tmp_path / "models/.partial/lab/Qwen3-Tiny/v1"
    partial.mkdir(parents=True)
    shard = "model-00002-of-00002.safetensors"
    (partial / "config.json").write_bytes((source / "config.json").read_bytes())
    (partial / shard).write_bytes((source / shard).read_bytes()[:1000])  # what an interrupted fetch leaves
    RangeHandler.requests.clear()

    assert run_stager(tmp_path, url) == (0, "")

    target = tmp_path / "models/lab/Qwen3-Tiny/v1"
    marker = json.loads((target / sw.MARKER_NAME).read_text())
    assert marker["model_id"] == "lab/Qwen3-Tiny" and marker["revision"] == "v1"
    assert marker["manifest_sha256"] == sw.manifest_sha256("lab/Qwen3-Tiny", "v1", marker["files"])
    assert sorted(p.name for p in target.iterdir()) == sorted([*marker["files"], sw.MARKER_NAME])
    assert not partial.exists()
    asked = dict(RangeHandler.requests)
    assert "/models/lab/Qwen3-Tiny/v1/config.json" not in asked  # complete and verified: not fetched again
    assert asked["/models/lab/Qwen3-Tiny/v1/" + shard] == "bytes=1000-"
    assert (target / shard).read_bytes() == (source / shard).read_bytes()

    RangeHandler.requests.clear()
    assert run_stager(tmp_path, url) == (0, "")  # already staged: nothing is asked of the mirror
    assert RangeHandler.requests == []


def test_a_corrupt_shard_is_refused_and_nothing_is_published(tmp_path, mirror):
    root, url = mirror
    bad = root / "models/lab/Qwen3-Tiny/bad"
    bad.mkdir()
    manifest = json.loads((root / "models/lab/Qwen3-Tiny/v1" / sw.MANIFEST_NAME).read_text())
    for name in manifest["files"]:
        (bad / name).write_bytes((root / "models/lab/Qwen3-Tiny/v1" / name).read_bytes())
    (bad / sw.MANIFEST_NAME).write_text(json.dumps({**manifest, "revision": "bad"}))
    shard = bad / "model-00001-of-00002.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[-10] ^= 0xFF
    shard.write_bytes(bytes(blob))

    code, err = run_stager(tmp_path, url, revision="bad")

    assert code == 1
    assert err.count("\n") == 1 and err.startswith("worker1: weights lab/Qwen3-Tiny@bad: model-00001-of-00002")
    assert "does not match the manifest" in err and "nothing was published" in err
    assert not (tmp_path / "models/lab/Qwen3-Tiny/bad").exists()
    assert not (tmp_path / "models/.partial/lab/Qwen3-Tiny/bad/model-00001-of-00002.safetensors").exists()


def test_an_existing_unverified_directory_is_never_replaced(tmp_path, mirror):
    _, url = mirror
    target = tmp_path / "models/lab/Qwen3-Tiny/v1"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")

    code, err = run_stager(tmp_path, url)

    assert code == 1 and "exists but is not a verified stage (it has no marker)" in err
    assert [p.name for p in target.iterdir()] == ["config.json"]


def flip_one_byte_keeping_size_and_mtime(path: Path) -> None:
    """What a disk's silent corruption leaves: the same size and mtime, another byte."""
    stamp = path.stat()
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))


def run_deep_verify(tmp_path) -> tuple[int, str]:
    argv = ["--host", "worker1", "--model-id", "lab/Qwen3-Tiny", "--revision", "v1",
            "--model-dir", str(tmp_path / "models"), "--deep-verify"]
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stderr", err)
        code = sw.main(argv)
    return code, err.getvalue()


def test_a_flipped_byte_is_found_by_the_deep_verify_and_only_that_file_restaged(tmp_path, mirror):
    root, url = mirror
    source, target = root / "models/lab/Qwen3-Tiny/v1", tmp_path / "models/lab/Qwen3-Tiny/v1"
    shard = "model-00001-of-00002.safetensors"
    assert run_stager(tmp_path, url) == (0, "")
    assert run_deep_verify(tmp_path) == (0, "")
    flip_one_byte_keeping_size_and_mtime(target / shard)
    RangeHandler.requests.clear()
    assert run_stager(tmp_path, url) == (0, "")  # sizes are all a rerun checks: nothing done
    assert RangeHandler.requests == []

    code, err = run_deep_verify(tmp_path)

    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"worker1: weights lab/Qwen3-Tiny@v1: {shard} sha256 ") and "restages it" in err
    record = json.loads((target / sw.DEEP_VERIFY_NAME).read_text())
    assert list(record["mismatched"]) == [shard] and record["restages"] == 0

    RangeHandler.requests.clear()
    assert run_stager(tmp_path, url) == (0, "")

    fetched = [path.rsplit("/", 1)[1] for path, _ in RangeHandler.requests]
    assert fetched == [sw.MANIFEST_NAME, shard]  # that file alone, from the source
    assert (target / shard).read_bytes() == (source / shard).read_bytes()
    assert oct((target / shard).stat().st_mode & 0o777) == "0o644"
    record = json.loads((target / sw.DEEP_VERIFY_NAME).read_text())
    assert record["mismatched"] == {} and record["restages"] == 1
    assert not (tmp_path / "models/.partial/lab/Qwen3-Tiny/v1").exists()
    assert run_deep_verify(tmp_path) == (0, "")
    assert json.loads((target / sw.DEEP_VERIFY_NAME).read_text())["restages"] == 1


def test_a_deep_verify_of_a_revision_not_staged_is_one_line(tmp_path):
    code, err = run_deep_verify(tmp_path)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("worker1: weights lab/Qwen3-Tiny@v1: ") and "holds no readable marker" in err


def test_files_an_interrupted_staging_kept_are_hashed_again_whatever_their_size_and_mtime(tmp_path, mirror):
    root, url = mirror
    cut = root / "models/lab/Qwen3-Tiny/cut"  # v1 less its last shard: the staging stops there
    manifest = json.loads((root / "models/lab/Qwen3-Tiny/v1" / sw.MANIFEST_NAME).read_text())
    cut.mkdir()
    (cut / sw.MANIFEST_NAME).write_text(json.dumps({**manifest, "revision": "cut"}))
    names = sorted(manifest["files"])
    for name in names[:-1]:
        (cut / name).write_bytes((root / "models/lab/Qwen3-Tiny/v1" / name).read_bytes())
    code, err = run_stager(tmp_path, url, revision="cut")
    assert code == 1 and names[-1] in err and "HTTP 404" in err
    shard = "model-00001-of-00002.safetensors"
    # What a crash can leave: the file whole in size, its last blocks never written.
    flip_one_byte_keeping_size_and_mtime(tmp_path / "models/.partial/lab/Qwen3-Tiny/cut" / shard)
    (cut / names[-1]).write_bytes((root / "models/lab/Qwen3-Tiny/v1" / names[-1]).read_bytes())
    RangeHandler.requests.clear()

    assert run_stager(tmp_path, url, revision="cut") == (0, "")

    fetched = sorted(path.rsplit("/", 1)[1] for path, _ in RangeHandler.requests)
    assert fetched == sorted([sw.MANIFEST_NAME, shard, names[-1]])
    published = tmp_path / "models/lab/Qwen3-Tiny/cut"
    assert all((published / name).read_bytes() == (cut / name).read_bytes() for name in names)


# ---------------------------------------------------------------- spread over peers


def serve_as_peer(model_dir: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A node's weights server as ascend_fleet/templates/weights-peer-nginx.conf.j2 lays it out."""
    root = model_dir.parent / "peer-root"
    root.mkdir()
    (root / sw.PEER_PUBLISHED_PATH).symlink_to(model_dir)
    (root / sw.PEER_STAGING_PATH).symlink_to(model_dir / sw.PARTIAL_DIR_NAME)
    receiving = root / sw.PEER_RECEIVING_PATH / "lab/Qwen3-Tiny"
    receiving.mkdir(parents=True)
    (receiving / "v1").symlink_to(model_dir / sw.PARTIAL_DIR_NAME / "lab/Qwen3-Tiny/v1" / sw.INCOMING_DIR_NAME)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def test_spread_takes_what_a_peer_holds_from_it_and_refuses_its_corrupt_copy(tmp_path, mirror, capsys):
    root, url = mirror
    source = root / "models/lab/Qwen3-Tiny/v1"
    names = sorted(json.loads((source / sw.MANIFEST_NAME).read_text())["files"])
    peer_dir = tmp_path / "peer/models"
    staging = peer_dir / ".partial/lab/Qwen3-Tiny/v1"
    (staging / ".incoming").mkdir(parents=True)
    good, bad, unverified = "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (staging / good).write_bytes((source / good).read_bytes())
    blob = bytearray((source / bad).read_bytes())
    blob[-10] ^= 0xFF  # a verified copy that rotted on the peer's disk
    (staging / bad).write_bytes(bytes(blob))
    (staging / ".incoming" / unverified).write_bytes((source / unverified).read_bytes()[:500])
    server, peer = serve_as_peer(peer_dir)
    RangeHandler.requests.clear()
    try:
        assert run_stager(tmp_path / "node", url, peers=[peer]) == (0, "")
    finally:
        server.shutdown()

    target = tmp_path / "node/models/lab/Qwen3-Tiny/v1"
    assert {name: (target / name).read_bytes() for name in names} == {
        name: (source / name).read_bytes() for name in names}
    asked = [path for path, _ in RangeHandler.requests]
    from_origin = {path.rsplit("/", 1)[1] for path in asked if path.startswith("/models/")}
    from_peer = {path.rsplit("/", 1)[1] for path in asked if path.startswith("/staging/") and not path.endswith("/")}
    assert good in from_peer and good not in from_origin  # a peer's verified copy spares the origin
    assert bad in from_peer and bad in from_origin  # refused from the peer, fetched whole from the origin
    assert unverified not in from_peer and ".incoming" not in " ".join(asked)  # a fetch in progress is never offered
    out = capsys.readouterr().out
    assert f"refused {bad} from {peer}: it sha256" in out
    assert "refused 1 bad copies from peers" in out


def test_a_file_being_fetched_is_on_disk_as_far_as_it_arrived(tmp_path):
    """Peers follow a copy as it grows (/receiving/): its bytes must reach the disk as they arrive."""
    half, rest_sent = b"a" * (1024 * 1024), threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * len(half)) + half)
            rest_sent.wait(10)
            connection.sendall(half)

    server = threading.Thread(target=serve)
    server.start()
    dest = tmp_path / "incoming/model-00001-of-00001.safetensors"
    fetch = threading.Thread(target=sw.sources.download_resuming,
                             args=(f"http://127.0.0.1:{listener.getsockname()[1]}/", dest, 2 * len(half)))
    fetch.start()
    try:
        deadline = time.monotonic() + 5
        while not (dest.exists() and dest.stat().st_size == len(half)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dest.stat().st_size == len(half)  # the first half, while the rest is still to come
    finally:
        rest_sent.set()
        fetch.join()
        server.join()
        listener.close()
    assert dest.read_bytes() == 2 * half


def peer_receiving(tmp_path, source: Path, shard: str, arrived: int = 1) -> tuple[Path, Path]:
    """A peer's model directory holding every file of the revision verified but shard, which it is
    still receiving (its first arrived bytes in incoming); its staging and incoming directories."""
    staging = tmp_path / "peer/models" / sw.PARTIAL_DIR_NAME / "lab/Qwen3-Tiny/v1"
    incoming = staging / sw.INCOMING_DIR_NAME
    incoming.mkdir(parents=True)
    for name in json.loads((source / sw.MANIFEST_NAME).read_text())["files"]:
        if name != shard:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes((source / name).read_bytes())
    (incoming / shard).write_bytes((source / shard).read_bytes()[:arrived])
    return staging, incoming


def stage_beside_a_peer_receiving(tmp_path, url, arrive) -> str:
    """Stage with one peer, also a seeder, whose copy arrives (arrive() writes it) meanwhile; its URL."""
    server, peer = serve_as_peer(tmp_path / "peer/models")
    arriving = threading.Thread(target=arrive)
    arriving.start()
    RangeHandler.requests.clear()
    try:
        assert run_stager(tmp_path / "node", url, peers=[peer], seeders=[peer]) == (0, "")
    finally:
        arriving.join()
        server.shutdown()
    return peer


@pytest.mark.parametrize(("arrived", "published"), [(1, False), (0, False), (1, True)],
                         ids=["first byte there", "just created", "published meanwhile"])
def test_spread_follows_a_file_as_it_arrives_at_a_peer_and_takes_the_rest_once_the_peer_verified_it(
        tmp_path, mirror, capsys, arrived, published):
    root, url = mirror
    source, shard = root / "models/lab/Qwen3-Tiny/v1", "model-00002-of-00002.safetensors"
    whole = (source / shard).read_bytes()
    staging, incoming = peer_receiving(tmp_path, source, shard, arrived)
    last = len(whole) - 1000  # the peer's last bytes land in its verified copy only (an origin's last write and rename)

    def arrive():
        for step in range(1, 21):
            time.sleep(0.1)
            with (incoming / shard).open("ab") as out:
                out.write(whole[arrived + (step - 1) * (last - arrived) // 20:arrived + step * (last - arrived) // 20])
        (staging / shard).write_bytes(whole)
        if published:  # the peer publishes before this node asks again: staging and incoming go at once
            revision = tmp_path / "peer/models/lab/Qwen3-Tiny/v1"
            revision.parent.mkdir(parents=True)
            staging.rename(revision)
            shutil.rmtree(revision / sw.INCOMING_DIR_NAME)
        else:
            (incoming / shard).unlink()

    peer = stage_beside_a_peer_receiving(tmp_path, url, arrive)

    assert (tmp_path / "node/models/lab/Qwen3-Tiny/v1" / shard).read_bytes() == whole
    asked = [path for path, _ in RangeHandler.requests if path.endswith(shard)]
    assert not [path for path in asked if path.startswith("/models/")]  # the origin never sent it
    assert f"/{sw.PEER_RECEIVING_PATH}/lab/Qwen3-Tiny/v1/{shard}" in asked  # taken while it arrived
    verified_there = sw.PEER_PUBLISHED_PATH if published else sw.PEER_STAGING_PATH
    assert asked[-1] == f"/{verified_there}/lab/Qwen3-Tiny/v1/{shard}"  # its last bytes once verified
    out = capsys.readouterr().out
    assert f"verified {shard} from {peer} as it arrived there" in out and "failed" not in out


def test_spread_leaves_a_copy_that_stops_arriving_and_fetches_the_file_elsewhere(tmp_path, mirror, monkeypatch,
                                                                                 capsys):
    root, url = mirror
    source, shard = root / "models/lab/Qwen3-Tiny/v1", "model-00002-of-00002.safetensors"
    whole = (source / shard).read_bytes()
    _, incoming = peer_receiving(tmp_path, source, shard)
    monkeypatch.setattr(spread_module, "RECEIVING_STALL_SECONDS", 1)
    monkeypatch.setattr(spread_module, "PROGRESS_SECONDS", 1)

    def arrive_then_stop():  # the peer's stager dies a third of the way
        for step in range(1, 11):
            time.sleep(0.1)
            with (incoming / shard).open("ab") as out:
                out.write(whole[1 + (step - 1) * len(whole) // 30:1 + step * len(whole) // 30])

    peer = stage_beside_a_peer_receiving(tmp_path, url, arrive_then_stop)

    assert (tmp_path / "node/models/lab/Qwen3-Tiny/v1" / shard).read_bytes() == whole
    out = capsys.readouterr().out
    assert f"{shard}: {peer} failed (its copy stayed at" in out
    assert f"/models/lab/Qwen3-Tiny/v1/{shard}" in [path for path, _ in RangeHandler.requests]  # the rest: origin


def test_spread_skips_a_peer_that_does_not_answer(tmp_path, mirror, capsys):
    _, url = mirror
    assert run_stager(tmp_path, url, peers=["http://127.0.0.1:9"]) == (0, "")  # discard port: refused
    assert "from the origin, 0 from peers (none)" in capsys.readouterr().out
    assert (tmp_path / "models/lab/Qwen3-Tiny/v1" / sw.MARKER_NAME).is_file()


def test_spread_asks_a_few_peers_at_a_time_each_in_turn(tmp_path, monkeypatch):
    peers = [f"http://worker{n}:8090" for n in range(1, 21)]
    in_flight, most, asked = set(), [0], []

    def listing(peer):
        in_flight.add(peer)
        most[0] = max(most[0], len(in_flight))
        asked.append(peer)
        time.sleep(0.05)
        in_flight.discard(peer)
        return {}, {}  # nothing verified, nothing arriving

    monkeypatch.setattr(spread_module, "PEER_POLL_SECONDS", 0.01)
    spread = spread_module.Spread(sw.Job("worker0", "lab/Qwen3-Tiny", "v1", tmp_path), None, peers, 0.0, [], True)
    monkeypatch.setattr(spread, "listing", listing)
    poller = threading.Thread(target=spread.poll, daemon=True)
    poller.start()
    time.sleep(1)
    spread.done.set()
    poller.join()
    assert most[0] == spread_module.PEERS_ASKED  # a node's requests do not grow with the fleet
    assert len(asked) > 2 * len(peers)
    for start in range(0, len(asked) - len(peers), len(peers)):  # every peer asked before any is asked again
        assert sorted(asked[start:start + len(peers)]) == sorted(peers)


def test_spread_skips_peers_that_accept_and_hang_after_one_listing_timeout(tmp_path, mirror, monkeypatch, capsys):
    _, url = mirror
    monkeypatch.setattr(spread_module, "PEER_LISTING_TIMEOUT_SECONDS", 1)
    hanging = []
    for _ in range(10):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel accepts; nobody answers
        hanging.append(listener)
    started = time.monotonic()
    try:
        assert run_stager(tmp_path, url, peers=[f"http://127.0.0.1:{s.getsockname()[1]}" for s in hanging]) == (0, "")
    finally:
        for listener in hanging:
            listener.close()
    assert time.monotonic() - started < 4  # a timeout to start and one to finish, not one per peer
    assert "7 from the origin, 0 from peers (none)" in capsys.readouterr().out


def test_spread_leaves_to_progressing_peers_the_files_they_presumably_fetch_from_the_origin(tmp_path):
    names = [f"model-{n:05d}.safetensors" for n in range(1, 13)]
    second, third = "http://worker2:8090", "http://worker3:8090"
    spread = spread_module.Spread(sw.Job("worker1", "lab/Qwen3-Tiny", "v1", tmp_path), None, [second, third], 0.0,
                                  [second, third], True)
    spread.files = {name: {"size": 1} for name in names}
    spread.share_out(names)
    assert spread.own_share == set(names[:4]) and spread.orders == {second: names[4:] + names[:4],
                                                                    third: names[8:] + names[:8]}
    # This node's share is done; worker2 verified the first file of its share, worker3 three of its.
    spread.waiting = [names[5], names[6], names[7], names[11]]
    spread.holdings = {second: {names[4]: "url"}, third: {name: "url" for name in names[8:11]}}
    spread.listed = {second: 1, third: 3}
    now = time.monotonic()
    spread.grew_at = {second: now, third: now}

    def origin_task():
        task = spread.next_task()
        spread.busy.clear()
        return task

    assert origin_task() == (names[7], None)  # worker2 on names[5], then names[6]; worker3 on names[11]
    spread.waiting = [names[5], names[6], names[11]]
    # names[6]: worker2 starts it once names[5] is verified, before a listing here can show it.
    assert origin_task() == spread_module.WAIT
    spread.waiting = [names[5], names[6], names[7]]
    spread.holdings[third][names[11]] = "url"  # worker3 is done with its share: it helps from its far end
    assert origin_task() == spread_module.WAIT  # worker2 on names[5] and names[6], worker3 on names[7]
    spread.grew_at[second] -= spread_module.PROGRESS_SECONDS  # worker2 stopped growing (its stager died?)
    assert origin_task() == (names[5], None)  # worker3 presumably on names[7] and names[6]


def test_a_node_not_seeding_leaves_the_origin_to_the_seeders_while_one_progresses(tmp_path):
    names = [f"model-{n:05d}.safetensors" for n in range(1, 10)]
    first, second = "http://worker1:8090", "http://worker2:8090"
    spread = spread_module.Spread(sw.Job("worker3", "lab/Qwen3-Tiny", "v1", tmp_path), None, [first, second], 2 / 3,
                                  [first], False)
    spread.files = {name: {"size": 1} for name in names}
    spread.share_out(names)
    assert spread.own_share == set() and spread.orders == {first: names}  # the one seeder's share: every file

    def task():
        chosen = spread.next_task()
        spread.busy.clear()
        spread.load.clear()
        return chosen

    assert task() == spread_module.WAIT  # worker1 is not seen growing yet: it is presumed to start
    spread.holdings[second] = {names[0]: "url"}
    assert task() == (names[0], second)
    spread.listed[first], spread.grew_at[first] = 0, time.monotonic() - spread_module.PROGRESS_SECONDS
    assert task() == (names[5], None)  # the seeder stopped: the origin, from the far end of this node's order


def test_a_peer_that_sends_all_it_may_is_asked_again_later_not_dropped(tmp_path, monkeypatch, capsys):
    name, peer = "model-00001.safetensors", "http://worker2:8090"
    spread = spread_module.Spread(sw.Job("worker1", "lab/Qwen3-Tiny", "v1", tmp_path), None, [peer], 0.0, [], True)
    spread.files = {name: {"size": 10}}
    spread.share_out([name])
    spread.holdings[peer] = {name: f"{peer}/staging/{name}"}

    def full(url, dest, size, timeout):
        raise urllib.error.HTTPError(url, 503, "Service Temporarily Unavailable", {}, None)

    monkeypatch.setattr(spread_module, "download_resuming", full)
    spread.fetch_one(name, peer)
    assert spread.holdings[peer] == {name: f"{peer}/staging/{name}"} and "failed" not in capsys.readouterr().out
    assert spread.next_task() == spread_module.WAIT  # neither the origin (a peer holds it) nor that peer, yet
    spread.full_until[peer] -= spread_module.PEER_FULL_SECONDS
    assert spread.next_task() == (name, peer)


def test_each_seeders_share_spreads_down_a_tree_whose_inner_nodes_differ_and_its_parent_is_asked_first(tmp_path):
    fleet = [f"http://worker{n:02d}:8090" for n in range(1, 13)]
    seeders, names = fleet[:4], [f"model-{n:05d}.safetensors" for n in range(1, 41)]
    spreads = {}
    for place, node in enumerate(fleet):
        spread = spread_module.Spread(sw.Job(node, "lab/Qwen3-Tiny", "v1", tmp_path), None,
                                      [peer for peer in fleet if peer != node], place / len(fleet),
                                      [seeder for seeder in seeders if seeder != node], node in seeders)
        spread.files = {name: {"size": 1} for name in names}
        spread.share_out(names)
        spreads[node] = spread
    children = Counter()
    for seeder in seeders:
        first = spreads[seeder].waiting[0]  # a file of this seeder's share
        parents = {node: spread.tree_parent[first] for node, spread in spreads.items() if node != seeder}
        for node in parents:  # every node reaches the seeder, up a tree
            seen, up = {node}, parents[node]
            while up != seeder:
                assert up not in seen
                seen.add(up)
                up = parents[up]
        per_parent = Counter(parents.values())
        assert max(per_parent.values()) <= spread_module.RELAY_FANOUT
        children.update(parent for parent in per_parent.elements() if parent != seeder)
    assert max(children.values()) <= 2 * spread_module.RELAY_FANOUT  # no node relays for every tree

    node = fleet[7]
    spread, name = spreads[node], spreads[seeders[1]].waiting[0]
    parent = spread.tree_parent[name]
    other = next(peer for peer in fleet if peer not in (node, parent))
    spread.waiting = [name]
    spread.holdings[other] = {name: "url"}  # verified there, still arriving at the parent
    spread.receiving[parent], spread.arrived[parent] = {name: "url"}, {name: (1, time.monotonic())}
    spread.grew_at = {seeder: time.monotonic() for seeder in seeders}
    assert spread.next_task() == (name, parent)


def test_a_copy_still_arriving_is_followed_only_when_it_holds_more_than_this_nodes_copy(tmp_path):
    name, first, second = "model-00001.safetensors", "http://worker2:8090", "http://worker3:8090"
    spread = spread_module.Spread(sw.Job("worker1", "lab/Qwen3-Tiny", "v1", tmp_path), None, [first, second], 0.0,
                                  [], False)
    spread.files = {name: {"size": 100}}
    spread.share_out([name])
    (spread.job.incoming / name).parent.mkdir(parents=True)
    (spread.job.incoming / name).write_bytes(b"x" * 40)  # this node followed a copy that went away at 40 bytes
    now = time.monotonic()
    for peer, size in ((first, 40), (second, 60)):  # worker2 went on following this node's copy
        spread.receiving[peer], spread.arrived[peer] = {name: f"{peer}/{name}"}, {name: (size, now)}
    assert spread.next_task() == (name, second)
    spread.busy.clear()
    spread.receiving[second] = {}
    assert spread.next_task() == (name, None)  # the origin (no seeder here), not worker2: each would wait on the other


@pytest.mark.parametrize("reader", ["pipe", "socket"])
def test_a_stager_whose_ssh_session_dropped_exits_at_once_and_lets_the_rerun_have_the_lock(reader):
    """sshd's end of a session's output goes away with the session: a stager still fetching then exits
    within a second instead of holding its revision's lock (the rerun would stop at it)."""
    program = ("import threading, time; from ascend_fleet.node.stage_weights.main import end_with_the_session; "
               "threading.Thread(target=end_with_the_session, daemon=True).start(); time.sleep(60)")
    if reader == "pipe":
        stager = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
        time.sleep(1)
        assert stager.poll() is None  # read: it goes on
        stager.stdout.close()
    else:
        ours, theirs = socket.socketpair()
        stager = subprocess.Popen([sys.executable, "-c", program], stdout=theirs)
        theirs.close()
        time.sleep(1)
        assert stager.poll() is None
        ours.close()
    started = time.monotonic()
    assert stager.wait(timeout=10) == SESSION_GONE_EXIT
    assert time.monotonic() - started < 2
