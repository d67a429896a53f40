"""The fleet as a source (class Spread): each file from a peer that serves a copy of it (verified,
or still arriving there), else from the origin, so the origin sends each file about once.

Who asks the origin: the seeders alone (a few nodes of the run, named by the deploy), each from its
own share of the file list, one file at a time, while another node fetches only from peers as long
as a seeder progresses. Every node asking the origin for its own share at once split the origin's
link N ways: each file took N times as long to arrive, they arrived in waves of N, and the last wave
still had to reach every node once the origin was done (bench-weights, 12 nodes: the origin done at
41 s, the nodes at 53 s, one node alone 35.5 s). A few streams keep the origin's link as busy, and
the last files arrive a few at a time; too few, and only the seeders' links carry new files to
the fleet (stages/peers.py ORIGIN_SEEDERS has the figures). A seeder that stops progressing (its
stager died) is presumed to fetch nothing; when none progresses, the other nodes ask the origin.

A file is taken from a peer as it arrives there (class Spread: follow), not only once the peer
verified it: a node waiting for whole copies left its link idle while the first files arrived at
the seeders, and every file crossed the fleet one whole copy at a time (bench-weights, 6 nodes,
0.25 GB in 16 files: 1.63 times one node; taken as they arrive, 1.44; in 64 files 1.19-1.22 and
1.17-1.19; once a fetch wrote each block as it arrived rather than 4 MiB at a time, 1.10-1.18 in
16 files and 1.10-1.13 in 64).
Such a copy is checked whole against the origin's manifest like any other. Each seeder's share
then crosses the fleet down a relay tree (Spread.relay_parent).

How peers are asked what they hold: PEERS_ASKED of them every PEER_POLL_SECONDS, at once, each
listing bounded by PEER_LISTING_TIMEOUT_SECONDS; the ones asked are those asked longest ago (ties
at random), so every peer's listing is at most ceil(peers / PEERS_ASKED) rounds old. A node thus
sends a fixed number of requests a second whatever the fleet's size (the fleet's load grows with
N, not N squared as when each node asked every peer every round), and a dead or hung peer holds
one asker for one timeout, then is skipped for PEER_RETRY_SECONDS. Chosen over a tracker (a
service more to run, and a single point whose death stops the spreading) and over a tree (a
dead inner node cuts off its subtree, and files descend it level by level): holdings only grow,
so a listing a few rounds old is still true, and a file verified anywhere is known fleet-wide
within a few rounds while its copies multiply.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .revision import (
    PEER_PUBLISHED_PATH,
    PEER_RECEIVING_PATH,
    PEER_STAGING_PATH,
    Job,
    StageError,
    model_path_parts,
    say,
)
from .sources import Source, download_resuming, http_get, write_as_it_arrives
from .verified import admit, check_fetched

# Spreading over the fleet (class Spread): files one node fetches at once, of which from the
# origin (its link is the scarce one: the fleet shares it), and how many peers are asked what
# they hold how often. Peer fetches are many short streams, each sharing its holder's link with
# other nodes' and never reaching a whole link's rate: 5 at once filled a node's link where 3
# did not (bench-weights, 12 nodes: 53.6 s against 61.9 s). A peer that failed is asked again
# after PEER_RETRY_SECONDS; one that sends nothing for PEER_TIMEOUT_SECONDS is given up for that file.
FETCHERS, ORIGIN_FETCHERS = 6, 1
PEERS_ASKED, PEER_POLL_SECONDS, PEER_LISTING_TIMEOUT_SECONDS = 4, 0.3, 5
PEER_RETRY_SECONDS, PEER_TIMEOUT_SECONDS = 5, 30
# A peer sending all the files it may at once answers 503 (templates/weights-peer-nginx.conf.j2):
# not asked for a file again for PEER_FULL_SECONDS, about the time one of its sends takes.
PEER_FULL_STATUS, PEER_FULL_SECONDS = 503, 0.5
# A copy a peer is still receiving is followed (its new bytes asked for every FOLLOW_SECONDS) unless
# its listings showed it at one size for RECEIVING_STALL_SECONDS; a follower that gets nothing new
# for as long leaves it.
FOLLOW_SECONDS, RECEIVING_STALL_SECONDS = 0.2, 5
# A peer whose listing grew this recently is progressing: the files it presumably fetches from
# the origin are left to it (see Spread), PRESUMED_FILES of them: the one it fetches and the one it
# starts once that is verified, which a listing seen here a few rounds ago cannot show yet
# (bench-weights, 12 nodes: with one, the origin sent 3 files twice, 14 MB, as a seeder done with
# its share took the next file of one still on its own).
PROGRESS_SECONDS = 10
PRESUMED_FILES = 2
IDLE_SECONDS = 0.2
# Each seeder's share spreads down a tree of the other nodes, RELAY_FANOUT children a node (see
# Spread.relay_parent). bench-weights, 12 nodes, while fetches still wrote 4 MiB at a time: 1.24-1.25
# (3 runs; 1.28 in scale.py's) with 2, 1.26 with 3, 1.27-1.29 without.
RELAY_FANOUT = 2
WAIT = "wait"


class Spread(Source):
    """The origin and the fleet: each file comes from a peer that serves a verified copy of it when
    one does, else from the origin, so the origin sends each file about once and a file spreads
    as soon as it arrives anywhere.

    A peer is another node's nginx (templates/weights-peer-nginx.conf.j2): ``/published/`` its published
    revisions, ``/staging/`` the verified files of revisions it is still staging, ``/receiving/`` the
    files of those it is still receiving, as far as they arrived; its JSON listings say what it holds. A
    copy still arriving counts as held (unless it stopped growing) and is followed: its new bytes asked
    for again and again, then the rest from the verified copy. Every copy is verified against the
    origin's manifest here, whoever sent it: a copy that does not match is deleted and never served on,
    and that peer is not asked for that file again. A peer that fails is skipped; the file resumes from
    another. A seeder keeps the origin busy with one file at a time that no peer holds: first its share
    of the list (the seeders start at even places of it; a share is the list over the seeders' number),
    then from the far end of its order backwards, so a seeder done with its share meets the one still on
    the previous share instead of following it. It leaves alone the files each progressing seeder (its
    listing grew in the last PROGRESS_SECONDS) presumably fetches from the origin now or next, as far as
    this node can tell: the first two of its share it lacks, or for a seeder done with its share, the two
    its own rule picks next (worked out in the fleet's order, so that the seeders done first spread over
    the last files instead of all asking for the same ones: they did, and a 270 MB model cost the origin
    320 MB over 6 nodes, 391 MB over 12). A node not seeding asks the origin only when no seeder progresses,
    then from the far end of its own order (it starts at origin_start, 0 to 1, a different place on each
    node). Beside it, the rarest file that peers hold, from the least busy holder. Peers are asked what
    they hold a few at a time (the module's doc says how and why).
    """

    def __init__(self, job: Job, origin: Source, peer_urls: list[str], origin_start: float,
                 seeder_urls: list[str], seeding: bool):
        super().__init__(job)
        self.origin, self.origin_start, self.seeding = origin, origin_start, seeding
        self.peers = [url.rstrip("/") for url in peer_urls]
        self.seeders = {url.rstrip("/") for url in seeder_urls}  # the other seeders
        self.started = time.monotonic()  # a seeder not yet seen growing is presumed to progress until PROGRESS_SECONDS
        self.lock = threading.Lock()
        self.holdings: dict[str, dict[str, str]] = {peer: {} for peer in self.peers}  # peer -> name -> URL
        # peer -> name -> URL of the copies it is receiving, first listed or seen growing in the last
        # RECEIVING_STALL_SECONDS; and the size of each as last listed, and when that was new.
        self.receiving: dict[str, dict[str, str]] = {peer: {} for peer in self.peers}
        self.arrived: dict[str, dict[str, tuple[int, float]]] = {peer: {} for peer in self.peers}
        self.asked_at = {peer: -math.inf for peer in self.peers}  # when each was last asked (monotonic)
        self.asking: set[str] = set()  # peers whose listing is being read
        self.listed: dict[str, int | None] = {}  # peer -> files in its last listing (None: it failed)
        self.grew_at: dict[str, float] = {}  # peer -> when its listing last grew
        self.first_round = threading.Event()
        self.avoided: dict[str, set[str]] = {}  # name -> peers not asked for it again (bad or cut-off copy)
        self.busy: dict[str, str | None] = {}  # name -> the peer (None: the origin) it is being fetched from
        self.load: Counter = Counter()  # peer -> files being fetched from it
        self.full_until: dict[str, float] = {}  # peer -> when it may have room again (monotonic)
        self.counts: Counter = Counter()  # "origin", each peer, "refused"
        self.done = threading.Event()
        self.failure: StageError | None = None
        self.files: dict = {}
        self.waiting: list[str] = []  # the files not yet verified, in the order this node asks the origin
        self.own_share: set[str] = set()
        self.orders: dict[str, list[str]] = {}  # seeder -> its order of asking the origin, as this node reckons it
        self.tree_parent: dict[str, str] = {}  # name -> the peer asked for it first (its relay parent)
        self.share = 0  # the files each seeder asks the origin for first (its share: its order's start)
        # Files fetched from peers at once while one comes from the origin: the origin's stream keeps
        # its part of this node's link (1 / the seeders' number: each seeder has that of the origin's).
        self.beside_origin = FETCHERS

    def describe(self) -> str:
        return f"{self.origin.describe()} spread over {len(self.peers)} peers"

    def manifest(self) -> dict:
        return self.origin.manifest()  # the digests always come from the origin, never from a peer

    def revision_url(self, peer: str, where: str) -> str:
        parts = model_path_parts(self.job.model_id, self.job.revision)
        return "/".join((peer, where, *map(urllib.parse.quote, parts), ""))

    def listing(self, peer: str) -> tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]]:
        """name -> (URL, size) of each file of the revision that the peer serves verified (at the
        manifest's size), and of each it is still receiving (shorter)."""
        staging = self.listed_there(peer, PEER_STAGING_PATH, whole=True)
        if staging is None:  # not staging it: published, or absent
            return self.listed_there(peer, PEER_PUBLISHED_PATH, whole=True) or {}, {}
        return staging, self.listed_there(peer, PEER_RECEIVING_PATH, whole=False) or {}

    def listed_there(self, peer: str, where: str, whole: bool) -> dict[str, tuple[str, int]] | None:
        """The peer's listing of the revision under where (see walk); None when it has none there."""
        try:
            return self.walk(self.revision_url(peer, where), "", whole)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
            return None

    def walk(self, base: str, prefix: str, whole: bool) -> dict[str, tuple[str, int]]:
        with http_get(base + urllib.parse.quote(prefix), {}, PEER_LISTING_TIMEOUT_SECONDS) as response:
            entries = json.load(response)
        found = {}
        for entry in entries:
            name = prefix + entry["name"]
            expected = self.files.get(name, {}).get("size")
            if entry["type"] == "directory" and any(known.startswith(name + "/") for known in self.files):
                found.update(self.walk(base, name + "/", whole))
            elif entry["type"] == "file" and expected is not None and (
                    entry["size"] == expected if whole else entry["size"] < expected):
                found[name] = (base + urllib.parse.quote(name), entry["size"])
        return found

    def poll(self) -> None:
        """Every PEER_POLL_SECONDS, ask the PEERS_ASKED peers asked longest ago (not being asked, not
        waiting out a failure) for their listings, at once."""
        with ThreadPoolExecutor(PEERS_ASKED) as askers:
            while not self.done.is_set():
                now = time.monotonic()
                with self.lock:
                    idle = [peer for peer in self.peers if peer not in self.asking and self.asked_at[peer] <= now]
                    random.shuffle(idle)
                    drawn = sorted(idle, key=self.asked_at.get)[:PEERS_ASKED - len(self.asking)]
                    self.asking.update(drawn)
                asked = [askers.submit(self.ask, peer) for peer in drawn]
                if not self.first_round.is_set():  # what peers hold before anything is asked of the origin
                    for future in asked:
                        future.result()
                    self.first_round.set()
                self.done.wait(PEER_POLL_SECONDS)

    def ask(self, peer: str) -> None:
        try:
            (held, arriving), retry = self.listing(peer), 0.0
        except (OSError, ValueError, TypeError, KeyError, http.client.HTTPException):
            held, arriving, retry = {}, {}, PEER_RETRY_SECONDS  # down, or not serving: skipped until it answers
        with self.lock:
            if retry == 0 and self.listed.get(peer) is not None and len(held) > self.listed[peer]:
                self.grew_at[peer] = time.monotonic()
            self.listed[peer] = None if retry else len(held)
            self.holdings[peer] = {name: url for name, (url, _) in held.items()}
            now, before, arrived = time.monotonic(), self.arrived[peer], {}
            for name, (_, size) in arriving.items():  # (size, since when it has been that size)
                arrived[name] = before[name] if before.get(name, (None,))[0] == size else (size, now)
            self.arrived[peer] = arrived
            self.receiving[peer] = {name: url for name, (url, _) in arriving.items()
                                    if now - arrived[name][1] < RECEIVING_STALL_SECONDS}
            self.asked_at[peer] = now + retry
            self.asking.discard(peer)

    def fetch_all(self, files: dict, pending: list[str]) -> None:
        self.files = files
        self.share_out(pending)
        poller = threading.Thread(target=self.poll, daemon=True)
        poller.start()
        self.first_round.wait(2 * PEER_LISTING_TIMEOUT_SECONDS)
        fetchers = [threading.Thread(target=self.fetcher, daemon=True) for _ in range(FETCHERS)]
        for thread in fetchers:
            thread.start()
        for thread in fetchers:
            thread.join()
        self.done.set()
        poller.join()
        if self.failure:
            raise self.failure
        by_peer = ", ".join(f"{peer} {self.counts[peer]}" for peer in self.peers if self.counts[peer])
        say(f"fetched {len(pending)} files: {self.counts['origin']} from the origin, "
            f"{sum(self.counts[peer] for peer in self.peers)} from peers ({by_peer or 'none'}); "
            f"refused {self.counts['refused']} bad copies from peers")

    def share_out(self, pending: list[str]) -> None:
        """This node's order of asking the origin, its share and (as it reckons them) the other seeders':
        the seeders, in the fleet's order, start at even places of the list."""
        ordered = sorted(pending)

        def from_place(fraction: float) -> list[str]:
            start = int(fraction * len(ordered)) % max(len(ordered), 1)
            return ordered[start:] + ordered[:start]

        place = round(self.origin_start * (len(self.peers) + 1))  # the peers are in the fleet's order, less this node
        fleet = self.peers[:place] + [None] + self.peers[place:]
        seeders = [peer for peer in fleet if peer in self.seeders or (peer is None and self.seeding)]
        self.share = math.ceil(len(pending) / max(len(seeders), 1))
        self.beside_origin = max(len(seeders) - 1, 1)
        self.orders = {seeder: from_place(index / len(seeders)) for index, seeder in enumerate(seeders)}
        self.tree_parent = {name: self.relay_parent(fleet, seeders, index)
                            for index, seeder in enumerate(seeders) if seeder is not None
                            for name in self.orders[seeder][:self.share]}
        # A node not seeding starts at its place in the fleet if it must ask the origin.
        self.waiting = self.orders.pop(None) if self.seeding else from_place(self.origin_start)
        self.own_share = set(self.waiting[:self.share]) if self.seeding else set()

    @staticmethod
    def relay_parent(fleet: list[str | None], seeders: list[str | None], index: int) -> str:
        """This node's (None's) parent in the relay tree of the index-th seeder's share: the other
        nodes in the fleet's order, turned by index / seeders of the way so that the inner nodes of
        each tree are others, under the seeder RELAY_FANOUT to a node. Every node works it out alike
        from the fleet's order. A file of that share is asked of the parent first whenever it holds
        it (verified or arriving) and has room: each stream then crosses the fleet down a tree whose
        inner nodes each pass it to RELAY_FANOUT others, where the rarest-first mesh left the seeder's
        few sending slots to whoever asked first (the tree of SplitStream; the mesh stays the fallback)."""
        seeder = seeders[index]
        receivers = [node for node in fleet if node != seeder]
        shift = index * len(receivers) // len(seeders)
        receivers = receivers[shift:] + receivers[:shift]
        position = receivers.index(None)
        return seeder if position < RELAY_FANOUT else receivers[position // RELAY_FANOUT - 1]

    def fetcher(self) -> None:
        while True:
            with self.lock:
                task = None if self.failure else self.next_task()
            if task is None:
                return
            if task == WAIT:
                time.sleep(IDLE_SECONDS)
                continue
            name, peer = task
            try:
                self.fetch_one(name, peer)
            except StageError as error:
                with self.lock:
                    self.failure = self.failure or error
            finally:
                with self.lock:
                    del self.busy[name]
                    self.load[peer] -= 1

    def next_task(self) -> tuple[str, str | None] | str | None:
        """(name, peer or None for the origin), WAIT, or None when every file left is being fetched."""
        left = [name for name in self.waiting if name not in self.busy]
        if not left:
            return None
        holders = {name: [peer for peer in self.peers if (name in self.holdings[peer] or self.ahead(peer, name))
                          and peer not in self.avoided.get(name, ())] for name in left}
        unheld = [name for name in left if not holders[name]]
        now = time.monotonic()
        for_origin = self.for_origin(unheld, now)
        from_origin = list(self.busy.values()).count(None)
        if for_origin and from_origin < ORIGIN_FETCHERS:  # keep the origin busy
            own = [name for name in for_origin if name in self.own_share]
            name, peer = own[0] if own else for_origin[-1], None
        else:
            # The files a holder with room (not answering 503 lately) can send now, and those holders.
            free = {name: room for name in left
                    if (room := [peer for peer in holders[name] if self.full_until.get(peer, 0) <= now])}
            if not free or (from_origin and len(self.busy) - from_origin >= self.beside_origin):
                return WAIT
            # A file whose relay parent holds it with room, from that parent (see relay_parent).
            relayed = [name for name in free if self.tree_parent.get(name) in free[name]]
            if relayed:
                name = min(relayed, key=lambda n: (len(holders[n]), random.random()))
                peer = self.tree_parent[name]
            else:
                name = min(free, key=lambda n: (len(holders[n]), random.random()))
                # A verified copy first: it can be sent at once, whole.
                peer = min(free[name], key=lambda p: (name not in self.holdings[p], self.load[p], random.random()))
        self.busy[name] = peer
        self.load[peer] += 1
        return name, peer

    def ahead(self, peer: str, name: str) -> bool:
        """Whether the peer's copy still arriving holds (as last listed) bytes beyond this node's. One no
        longer than ours has nothing for us: nodes that each followed the other waited on one another
        (bench-weights, 12 nodes: three at the same 3993329 bytes, each until RECEIVING_STALL_SECONDS)."""
        if name not in self.receiving[peer]:
            return False
        ours = self.job.incoming / name
        return self.arrived[peer][name][0] > (ours.stat().st_size if ours.exists() else 0)

    def for_origin(self, unheld: list[str], now: float) -> list[str]:
        """The files no peer holds that this node may ask the origin for: a seeder, those of its share
        and those no progressing seeder presumably fetches; another node, those only when no seeder
        progresses (they are all done, or their stagers died)."""
        progressing = [seeder for seeder in self.orders if self.listed.get(seeder, 0) is not None  # None: it failed
                       and now - self.grew_at.get(seeder, self.started) < PROGRESS_SECONDS]
        if progressing and not self.seeding:
            return []
        theirs = self.left_to_seeders(unheld, progressing)
        return [name for name in unheld if name in self.own_share or name not in theirs]

    def left_to_seeders(self, unheld: list[str], progressing: list[str]) -> set[str]:
        """The files the progressing seeders presumably fetch from the origin now or next
        (PRESUMED_FILES each): the first files of its share each lacks; then, in the fleet's order, for
        each seeder done with its share, the last files of its order that no one holds or is presumed on."""
        presumed, helpers = set(), []
        for seeder in progressing:
            order = self.orders[seeder]
            lacking = [name for name in order[:self.share] if name not in self.holdings[seeder]]
            if lacking:
                presumed.update(lacking[:PRESUMED_FILES])
            else:
                helpers.append(seeder)
        unheld_now = set(unheld)
        for seeder in helpers:
            last = [name for name in reversed(self.orders[seeder]) if name in unheld_now and name not in presumed]
            presumed.update(last[:PRESUMED_FILES])
        return presumed

    def peer_failed(self, name: str, peer: str, error: Exception) -> None:
        say(f"{name}: {peer} failed ({str(error) or type(error).__name__}); fetching the rest elsewhere")
        with self.lock:
            self.holdings[peer], self.receiving[peer] = {}, {}  # until it answers a listing again

    def follow(self, peer: str, name: str, dest: Path, size: int) -> None:
        """The copy of a file the peer is still receiving: the bytes it has beyond ours, asked again
        every FOLLOW_SECONDS as more arrive, up to the manifest's size; once the copy leaves the
        peer's incoming directory (it verified it), the rest from its verified copy (rest_from_verified).
        A copy that does not grow for RECEIVING_STALL_SECONDS is left (TimeoutError); checked whole like
        any other."""
        url, grew_at = self.receiving[peer][name], time.monotonic()
        dest.parent.mkdir(parents=True, exist_ok=True)
        while (have := dest.stat().st_size if dest.exists() else 0) < size:
            try:
                # From the start, no range: nginx answers one of an empty file (just created) with a 200.
                with http_get(url, {"Range": f"bytes={have}-"} if have else {}, PEER_TIMEOUT_SECONDS) as response:
                    if have and response.status != 206:
                        raise http.client.HTTPException(f"answered {response.status} to a range from {have}")
                    if response.length != 0:  # no empty copy here: others would follow it, and it might be the peer
                        with dest.open("ab") as out:
                            write_as_it_arrives(response, out)
            except urllib.error.HTTPError as error:
                if error.code == 404:  # verified there (or refused: then the staging copy is missing too)
                    self.rest_from_verified(peer, name, dest, size)
                    return
                if error.code != 416:  # 416: nothing beyond our bytes yet
                    raise
            now = time.monotonic()
            if dest.exists() and dest.stat().st_size > have:
                grew_at = now
            elif now - grew_at > RECEIVING_STALL_SECONDS:
                raise TimeoutError(f"its copy stayed at {have} bytes for {RECEIVING_STALL_SECONDS} s")
            else:
                time.sleep(FOLLOW_SECONDS)

    def rest_from_verified(self, peer: str, name: str, dest: Path, size: int) -> None:
        """The rest of a file from the peer's verified copy: staging, or its published revision when it
        published in between (a 404 from both: it refused its copy)."""
        for where in (PEER_STAGING_PATH, PEER_PUBLISHED_PATH):
            try:
                download_resuming(self.revision_url(peer, where) + urllib.parse.quote(name), dest, size,
                                  PEER_TIMEOUT_SECONDS)
                return
            except urllib.error.HTTPError as error:
                if error.code != 404 or where == PEER_PUBLISHED_PATH:
                    raise

    def fetch_one(self, name: str, peer: str | None) -> None:
        entry, incoming, how = self.files[name], self.job.incoming / name, ""
        resumed = incoming.is_file() and incoming.stat().st_size > 0
        if peer is None:
            self.origin.fetch([name], self.job.incoming)
        else:
            try:
                if name in self.holdings[peer]:
                    download_resuming(self.holdings[peer][name], incoming, entry["size"], PEER_TIMEOUT_SECONDS)
                else:
                    self.follow(peer, name, incoming, entry["size"])
                    how = " as it arrived there"
            except urllib.error.HTTPError as error:
                if error.code == PEER_FULL_STATUS:  # it sends all the files it may at once: another holder, or later
                    with self.lock:
                        self.full_until[peer] = time.monotonic() + PEER_FULL_SECONDS
                else:
                    self.peer_failed(name, peer, error)
                return
            except (OSError, KeyError, http.client.HTTPException) as error:
                self.peer_failed(name, peer, error)
                return
        problem, short = check_fetched(self.job, name, entry)
        with self.lock:
            if problem is None:
                admit(self.job, name)
                self.waiting.remove(name)
                self.counts[peer or "origin"] += 1
                say(f"verified {name} from {peer or 'the origin'}{how}")
            elif peer is not None and short:  # the peer hung up (it died?): the bytes so far are kept
                self.avoided.setdefault(name, set()).add(peer)
                say(f"{name}: {peer} stopped sending at {incoming.stat().st_size} of {entry['size']} bytes; "
                    "resuming it from another holder")
            elif peer is not None:
                self.avoided.setdefault(name, set()).add(peer)
                self.counts["refused"] += 1
                say(f"refused {name} from {peer}: it {problem}; fetching it elsewhere")
            elif not (short or resumed):  # the origin's own whole copy is wrong: nothing to fall back on
                raise self.job.error(f"{name} {problem}; nothing was published: rerun (and if it fails "
                                     f"again, fix the copy at {self.origin.describe()})")
