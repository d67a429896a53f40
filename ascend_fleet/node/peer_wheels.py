#!/usr/bin/env python3
"""Put verified wheels in this node's wheel directory, from peers or from pip's download.

ascend_fleet.operations.python_stack ships this file to the node and runs it as root with the
serving virtualenv's python; stdlib only.

A file enters WHEEL_DIR (which the node's peer server offers the fleet at /wheels/) only by a
rename after its sha256 matched the digest the origin's package index gives for that file name
(the ``#sha256=`` fragment of its link, PEP 503): never a digest a peer says. A file the origin
does not list with a digest is never taken from a peer (pip downloads it from the index).

    --peer URL ...   take from the peers' /wheels/ every file this node lacks: the first PEERS_ASKED
                     peers given (the caller puts the seeder first, then the others from this node's
                     place on) are asked for their listings all at once, so dead or hung peers cost
                     one listing timeout together, and the fleet's requests grow with its size, not
                     its square; each file is taken from the first of them that lists it, the next
                     holder if that copy fails or is refused
    --admit          check what `pip download` left in WHEEL_DIR/.incoming and rename it in

Either way, the files already in WHEEL_DIR are checked again first (a copy that rotted on disk is
deleted, so it is neither installed nor served on).

Errors: one line on stderr, ``<host>: wheels: <what>; <what to do>``, exit 1. A refused copy is
a line on stderr too, and the next source is tried (the exit stays 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

INCOMING_DIR_NAME = ".incoming"
PEER_WHEELS_PATH = "wheels"
HTTP_TIMEOUT_SECONDS = 30
# A peer is a fleet node on the same network: one whose listing does not come this fast is down.
PEER_LISTING_TIMEOUT_SECONDS = 5
# Peers asked at once: enough that a few dead ones leave holders to take from, few enough that
# a node's requests do not grow with the fleet (every peer holds the same wheels once seeded).
PEERS_ASKED = 8
LINK = re.compile(r'href="([^"]+)"')
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def normalize(project: str) -> str:
    """PEP 503 project name normalization (the controller's code uses this one too)."""
    return re.sub(r"[-_.]+", "-", project).lower()


def project_of(file_name: str) -> str:
    """The normalized project of a wheel (name-version-tags.whl) or sdist (name-version.tar.gz)."""
    if file_name.endswith(".whl"):
        return normalize(file_name.split("-", 1)[0])
    stem = re.sub(r"\.(tar\.gz|zip)$", "", file_name)
    return normalize(stem.rsplit("-", 1)[0])


def digests_in_page(html: str) -> dict[str, str]:
    """File name -> sha256 of every link of a PEP 503 project page that carries a #sha256= fragment."""
    digests = {}
    for href in LINK.findall(html):
        url, _, fragment = href.partition("#")
        algorithm, _, digest = fragment.partition("=")
        if algorithm == "sha256" and SHA256_HEX.match(digest):
            digests[urllib.parse.unquote(url.rsplit("/", 1)[-1])] = digest
    return digests


class Origin:
    """The digests the origin's indexes give, one project page fetched once."""

    def __init__(self, index_urls: list[str]):
        self.index_urls = [url.rstrip("/") for url in index_urls]
        self.pages: dict[str, dict[str, str]] = {}

    def digest(self, file_name: str) -> str | None:
        project = project_of(file_name)
        if project not in self.pages:
            self.pages[project] = {}
            for index in self.index_urls:
                try:
                    with urllib.request.urlopen(f"{index}/{project}/", timeout=HTTP_TIMEOUT_SECONDS) as response:
                        self.pages[project].update(digests_in_page(response.read().decode("utf-8", "replace")))
                except (urllib.error.URLError, OSError):
                    continue
        return self.pages[project].get(file_name)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def mismatch(path: Path, origin: Origin) -> str | None:
    """How the file's digest differs from the one the origin's index gives for its name, or None
    (also when the index gives none: from_peers takes no such file from a peer)."""
    expected, actual = origin.digest(path.name), sha256_of(path)
    if expected is None or expected == actual:
        return None
    return f"has sha256 {actual}, the origin index gives {expected}"


def admit(path: Path, wheel_dir: Path, origin: Origin, source: str) -> bool:
    """Rename a fetched file into wheel_dir if its digest is the origin's; else delete it and say so."""
    problem = mismatch(path, origin)
    if problem:
        path.unlink()
        print(f"{socket.gethostname()}: wheel {path.name} from {source} {problem}: refused and deleted, "
              "trying the next source", file=sys.stderr)
        return False
    os.chmod(path, 0o644)
    path.rename(wheel_dir / path.name)
    return True


def admit_again(path: Path, origin: Origin) -> None:
    """Delete a file of the wheel directory whose digest is no longer the origin's."""
    problem = mismatch(path, origin)
    if problem:
        path.unlink()
        print(f"{socket.gethostname()}: wheel {path.name} in {path.parent} {problem}: deleted, fetching it again",
              file=sys.stderr)


def peer_listing(peer: str) -> list[str]:
    with urllib.request.urlopen(f"{peer}/{PEER_WHEELS_PATH}/", timeout=PEER_LISTING_TIMEOUT_SECONDS) as response:
        return [entry["name"] for entry in json.load(response) if entry.get("type") == "file"]


def peer_listings(peers: list[str]) -> dict[str, list[str]]:
    """peer -> the files it lists, of the peers that answered within PEER_LISTING_TIMEOUT_SECONDS,
    all asked at once (a peer that is down, hangs or serves no wheels is left out)."""
    listings: dict[str, list[str]] = {}

    def ask(peer: str) -> None:
        try:
            listings[peer] = peer_listing(peer)
        except (urllib.error.URLError, OSError, ValueError):
            pass

    askers = [threading.Thread(target=ask, args=(peer,), daemon=True) for peer in peers]
    for thread in askers:
        thread.start()
    deadline = time.monotonic() + PEER_LISTING_TIMEOUT_SECONDS
    for thread in askers:  # the timeout bounds each read, the deadline the whole (a trickling peer)
        thread.join(max(0.0, deadline - time.monotonic()))
    return {peer: listings[peer] for peer in peers if peer in listings}


def from_peers(peers: list[str], wheel_dir: Path, incoming: Path, origin: Origin) -> int:
    taken = 0
    listings = peer_listings([peer.rstrip("/") for peer in peers[:PEERS_ASKED]])
    wanted = sorted({name for names in listings.values() for name in names})
    for name in wanted:
        if (wheel_dir / name).exists() or "/" in name or name.startswith(".") or not origin.digest(name):
            continue
        part = incoming / name
        for peer in (peer for peer, names in listings.items() if name in names):
            url = f"{peer}/{PEER_WHEELS_PATH}/{urllib.parse.quote(name)}"
            try:
                with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response, part.open("wb") as f:
                    shutil.copyfileobj(response, f)
            except (urllib.error.URLError, OSError):
                part.unlink(missing_ok=True)
                continue
            if admit(part, wheel_dir, origin, peer):
                taken += 1
                break
    return taken


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-dir", required=True, type=Path)
    parser.add_argument("--index-url", action="append", required=True)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--peer", action="append")
    action.add_argument("--admit", action="store_true")
    args = parser.parse_args(argv)
    incoming = args.wheel_dir / INCOMING_DIR_NAME
    incoming.mkdir(parents=True, exist_ok=True)
    origin = Origin(args.index_url)
    # What rotted on this disk since is neither installed from here nor served on.
    for path in sorted(args.wheel_dir.iterdir()):
        if path.is_file():
            admit_again(path, origin)
    if args.admit:
        refused = [path.name for path in sorted(incoming.iterdir()) if not admit(path, args.wheel_dir, origin, "pip")]
        if refused:
            print(f"{socket.gethostname()}: wheels: {', '.join(refused)} downloaded from the index do not match "
                  "the sha256 its pages give; check the index (a corrupt mirror?), then rerun", file=sys.stderr)
            return 1
        return 0
    print(f"{from_peers(args.peer, args.wheel_dir, incoming, origin)} wheels from peers, sha256 verified")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
