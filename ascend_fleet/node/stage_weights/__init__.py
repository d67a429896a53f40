"""Stage one model revision on this node's NVMe: fetch, verify, publish atomically.

ascend_fleet.operations.weights.staged ships this package to the node as one
zip archive (``python3 stage_weights.pyz ...``) and runs it as root; the
controller imports it too (layout, marker, parsers), so it stays stdlib-only
python3. Its parts: revision.py (what a staged revision is), sources.py (where
files come from), verified.py (admitting a fetched file), spread.py (the fleet
as a source), main.py (the run and its command line).

Layout under MODEL_DIR, all on one filesystem so that publishing is a rename:

    <org>/<name>/<revision>/                             published; changed only by a restage (below)
    <org>/<name>/<revision>/.ascend-fleet-staged.json    the marker: id, revision, manifest sha256, files
    <org>/<name>/<revision>/.ascend-fleet-deep-verify.json  the last deep verify: files unlike the manifest
    .partial/<org>/<name>/<revision>/                    verified files of a revision still being staged
    .partial/<org>/<name>/<revision>/.incoming/          fetches in progress, kept across runs
    .partial/<org>/<name>/<revision>.lock                one stager per revision at a time

A file enters the partial directory only by a rename after its digest matched the
manifest, so what lies there (not hidden) is verified: the ``peers`` spread serves
that directory and published revisions to the fleet (``--peer-url``), and the files
still arriving in incoming as far as they have, which a peer takes as they grow and
checks whole against the manifest like any other copy.

Flow: read the source's manifest (size and digest of every file); check free
space for what is still to fetch plus a margin; fetch what the partial
directory lacks, resuming cut-off files; verify every file's digest and the
safetensors header of every shard the index names; write the marker; rename
the directory into place. Directories of other revisions are never touched.
A rerun after an interrupted staging hashes every file it kept again.

Deep verify (``--deep-verify``): hash every file of a published revision against the
manifest its marker keeps and record the files that differ beside the marker; the
next staging of that revision fetches those again (from peers or the origin, verified
like any fetch) and renames each over its bad copy: the only change ever made to a
published directory.

A source is anything with ``manifest()`` (file -> size and digest) and
``fetch(names, incoming)``; the verification and publishing around it do not
depend on where bytes come from. With ``--peer-url`` the source is only the
origin: each file comes from a fleet node that holds a verified copy when one
does, from the origin when none does yet (class Spread).

Tokens (MODELSCOPE_API_TOKEN, HF_TOKEN) come from a root-only 0600 env file and
reach child processes through their environment, never their command line.

Errors: one line on stderr, ``<host>: weights <id>@<revision>: <what>; <what to do>``, exit 1.
"""

from __future__ import annotations

from .main import bytes_still_to_fetch, check_space, main, make_source, parse_args
from .revision import (
    DEEP_VERIFY_NAME,
    INCOMING_DIR_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    MARKER_NAME,
    PARTIAL_DIR_NAME,
    PEER_PUBLISHED_PATH,
    PEER_RECEIVING_PATH,
    PEER_STAGING_PATH,
    SOURCES,
    Job,
    StageError,
    deep_verify_of,
    file_digest,
    file_problem,
    files_from_hf_tree,
    files_from_mirror_manifest,
    files_from_modelscope_listing,
    hf_next_page,
    manifest_sha256,
    marker_problems,
    model_path_parts,
    partial_dir,
    read_safetensors_header,
    revision_dir,
    shards_to_check,
)
from .sources import (
    HuggingFace,
    ModelScope,
    hf_download_argv,
    modelscope_download_argv,
    read_tokens_env_file,
    rsync_argv,
    run_tool,
    ssh_cat_argv,
)

# What the controller and the tests use, by one name: ascend_fleet.node.stage_weights.
__all__ = [
    "DEEP_VERIFY_NAME", "INCOMING_DIR_NAME", "INDEX_NAME", "MANIFEST_NAME", "MARKER_NAME", "PARTIAL_DIR_NAME",
    "PEER_PUBLISHED_PATH", "PEER_RECEIVING_PATH", "PEER_STAGING_PATH", "SOURCES", "HuggingFace", "Job",
    "ModelScope", "StageError", "bytes_still_to_fetch", "check_space", "deep_verify_of", "file_digest",
    "file_problem", "files_from_hf_tree", "files_from_mirror_manifest", "files_from_modelscope_listing",
    "hf_download_argv", "hf_next_page", "main", "make_source", "manifest_sha256", "marker_problems",
    "model_path_parts", "modelscope_download_argv", "parse_args", "partial_dir", "read_safetensors_header",
    "read_tokens_env_file", "revision_dir", "rsync_argv", "run_tool", "shards_to_check", "ssh_cat_argv",
]
