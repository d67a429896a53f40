"""`ascend-fleet profile lock`: what a profile's pip steps leave on a node, as one pinned, hashed set.

A node runs the steps in order (`pip install vllm`, uninstalls, `pip install vllm-ascend torch torch-npu`,
builds over pins): each install keeps what the ones before it installed where that still meets it, and
leaves the requirements of packages it does not touch broken (vllm's torch pin), which the profile accepts
by name. The lock is made the same way with uv, which resolves for the node's platform natively:

1. each install step is resolved alone, preferring what the steps before it left (uv's preferences, as
   pip keeps what is installed); its pins replace the earlier ones; uninstalls take packages out; a build
   over a pin takes its pin's place (its own metadata being unknown, the pin's stands in);
2. that environment is judged as the node's gate judges it: `pip check`'s complaints, worked out from
   each package's metadata, must all be among the profile's `accepts`;
3. uv resolves every step's requirements at once, held to that environment, with the accepted
   complaints' packages as overrides (the two-step install as one set), and writes it with sha256 hashes.

The lock is written beside the profiles (`locks/<profile>.<arch>-py<python>.txt`) with a header naming
the profile's digest: `profile check` refuses a lock the profile has moved away from.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ascend_fleet.config.profile import InstallStep, OverrideStep, PipLocked, Profile, RemoveStep, Router
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.profile_check import DEFAULT_GLIBC, Indexes, IndexFile, Platform, Standin, sdist_metadata

LOCKS_DIR = Path(__file__).parents[1] / "profiles" / "locks"
UV_TIMEOUT = 900  # seconds for one resolution; a whole vLLM stack takes seconds once uv's cache is warm
METADATA_READERS = 8  # metadata files fetched at once
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")
FROM_INDEX = re.compile(r"^\s+# from (?P<index>\S+)")
DIGEST_LINE = "# profile digest: "
GLIBC_IN_HEADER = re.compile(r"^# ascend-fleet profile lock .* --glibc (?P<glibc>2\.\d+)$", re.M)
NEVER = 'python_version < "0"'  # a marker no node meets: an override that takes a package out
# vllm-router's wheels are manylinux_2_28 (0.1.17): its lock takes no wheel that needs a newer glibc.
ROUTER_GLIBC = "2.28"
# uv's words for a pin no index it asked has: a version the indexes do not list, or a project none of them lists
# (then the pin is the one uv names beside it).
NO_VERSION = re.compile(r"there is no version of (?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s,]+)")
NOT_LISTED = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*) was not found in the package registry")
# Packages built for NVIDIA GPUs: PyPI's torch requires them, the PyTorch CPU index's +cpu builds do not; no use
# on an Ascend node, and GBs each (the lab's stand-ins leave them out too).
CUDA_PACKAGES = frozenset({"triton", "xformers", "flashinfer-python"})
CUDA_PREFIXES = ("nvidia-", "cuda-")


def is_cuda_requirement(requirement: str) -> bool:
    """A requirement on an NVIDIA build (nvidia-*, cuda-*, triton, xformers, flashinfer-python)."""
    name = canonicalize_name(Requirement(requirement).name)
    return name.startswith(CUDA_PREFIXES) or name in CUDA_PACKAGES


def lock_path(profile_name: str, platform: Platform) -> Path:
    return LOCKS_DIR / f"{profile_name}.{platform.arch}-py{platform.python}.txt"


def profile_digest(profile: Profile, platform: Platform) -> str:
    """What the lock depends on in the profile: its pip section and pins, and the node's arch and Python (the
    lock's glibc is the oldest it serves, in its header)."""
    data = [profile.pip.model_dump(mode="json"), profile.pip_pins(), platform.arch, platform.python]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass
class Dist:
    """One distribution of the environment: its version, the index it comes from, its Requires-Dist."""

    version: str
    index: str
    requires: list[str] = field(default_factory=list)
    build: str | None = None  # the file of a build over this pin, whose own metadata is unknown
    unread: str | None = None  # why its file was not read: a stand-in's requires are what the check could know


class UvResolver:
    """uv's resolver for one node platform against the profile's indexes, with no configuration of this machine."""

    def __init__(self, platform: Platform, indexes: list[str], source_builds: list[str], workdir: Path) -> None:
        self.platform, self.indexes, self.workdir = platform, indexes, workdir
        self.standins = workdir / "standins"  # metadata-only wheels for files of indexes that did not answer
        self.standins.mkdir(parents=True, exist_ok=True)
        from uv import find_uv_bin  # imported here: only locking needs uv's binary

        self.argv = [find_uv_bin(), "pip", "compile", "--quiet", "--python-platform",
                     f"{platform.arch}-manylinux_{platform.glibc.replace('.', '_')}",
                     "--python-version", platform.python, "--index-url", indexes[0],
                     *(option for url in indexes[1:] for option in ("--extra-index-url", url)),
                     # pip's way with several indexes: the best version from any of them.
                     "--index-strategy", "unsafe-best-match", "--emit-index-annotation",
                     "--find-links", str(self.standins), "--only-binary", ":all:",
                     *(option for name in source_builds for option in ("--no-binary", name))]
        self.environ = {**{k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))},
                        "UV_NO_CONFIG": "1"}

    def compile(self, requirements: list[str], preferred: dict[str, Dist] | None = None,
                constraints: dict[str, Dist] | None = None, overrides: list[str] = (), hashes: bool = False,
                left_out: list[str] = ()) -> tuple[dict[str, Dist], str]:
        """The resolution of requirements: {name: Dist} and uv's output."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        files = {"requirements.in": requirements, "constraints.txt": pins(constraints or {}),
                 "overrides.txt": overrides}
        for name, lines in files.items():
            (self.workdir / name).write_text("".join(f"{line}\n" for line in lines))
        output = self.workdir / "resolved.txt"
        output.write_text("".join(f"{line}\n" for line in pins(preferred or {})))  # uv prefers these versions
        argv = [*self.argv, "requirements.in", "-o", output.name, "-c", "constraints.txt", "--overrides",
                "overrides.txt", *(["--generate-hashes"] if hashes else []),
                *(option for name in left_out for option in ("--no-emit-package", name))]
        try:
            result = subprocess.run(argv, cwd=self.workdir, capture_output=True, text=True, env=self.environ,
                                    timeout=UV_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise FleetError(f"profile lock: uv did not resolve within {UV_TIMEOUT} s for {self.platform}") from None
        if result.returncode != 0:
            raise LockError(uv_reason(result.stderr))
        text = output.read_text()
        return parse_resolution(text), text


class LockError(FleetError):
    """The steps do not lock: one line saying why."""


def uv_reason(stderr: str) -> str:
    """uv's reason in one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    causes = [line.removeprefix("cause: ") for line in lines if not line.startswith(("hint:", "error:", "Error:"))]
    return " ".join(causes) or (lines[-1] if lines else "uv failed without a message")


def pins(dists: dict[str, Dist]) -> list[str]:
    return [f"{name}=={dist.version}" for name, dist in sorted(dists.items())]


def parse_resolution(text: str) -> dict[str, Dist]:
    """{canonical name: Dist} of uv's output, each with the index its annotation names."""
    resolved: dict[str, Dist] = {}
    last = None
    for line in text.splitlines():
        if match := PIN.match(line):
            last = canonicalize_name(match["name"])
            resolved[last] = Dist(match["version"], "")
        elif (match := FROM_INDEX.match(line)) and last:
            resolved[last].index = match["index"]
    return resolved


def pip_check(environment: dict[str, Dist], platform: Platform) -> list[str]:
    """The complaints `pip check` prints for this environment on the node, in its words."""
    node = {**platform.markers(), "extra": ""}
    complaints = []
    for name, dist in sorted(environment.items()):
        for line in dist.requires:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(node):
                continue
            wanted = canonicalize_name(requirement.name)
            if wanted not in environment:  # pip names a missing one by its name alone
                complaints.append(f"{name} {dist.version} requires {wanted}, which is not installed.")
            elif not requirement.specifier.contains(environment[wanted].version, prereleases=True):
                complaints.append(f"{name} {dist.version} has requirement {requirement}, but you have "
                                  f"{wanted} {environment[wanted].version}.")
    return complaints


def read_metadata(environment: dict[str, Dist], platform: Platform, indexes: Indexes) -> None:
    """Each distribution's Requires-Dist, from the file a node of platform would install: the index's
    metadata file (PEP 658) where it serves one, else the wheel's METADATA or the sdist's PKG-INFO."""

    def read(name: str) -> None:
        dist = environment[name]
        files = [f for f in indexes.files(dist.index, name) if f.version == Version(dist.version)]
        wheel = next((f for f in files if f.wheel and f.wheel[1] & platform.tags), None)
        chosen = wheel or next((f for f in files if not f.wheel), None)
        if chosen is None:
            raise LockError(f"{dist.index} lists no file of {name} {dist.version} for {platform}")
        dist.requires = requires_dist(chosen, indexes)

    with ThreadPoolExecutor(METADATA_READERS) as pool:
        list(pool.map(read, list(environment)))


def requires_dist(file: IndexFile, indexes: Indexes) -> list[str]:
    if file.has_metadata:
        text = indexes.fetch_url(f"{file.url.split('#', 1)[0]}.metadata").decode()
        return Parser().parsestr(text).get_all("Requires-Dist") or []
    content = indexes.fetch(file)
    if not file.wheel:
        info = sdist_metadata(content)
        return (info.get_all("Requires-Dist") or []) if info else []
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode()).get_all("Requires-Dist") or []


@dataclass
class Lock:
    """A profile's lock for one platform: the environment, the complaints it leaves, and the file's text."""

    profile: Profile
    platform: Platform
    environment: dict[str, Dist]
    complaints: list[str]
    text: str

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(self.text)
        os.replace(partial, path)


class StandinSupplier:
    """Metadata-only stand-ins for the files the profile takes from an index that did not answer (`pip.sources`):
    a +cpu build carries its public release's requirements on the main index less the CUDA packages (the PyTorch
    CPU index's builds are PyPI's without them); any other carries none, its requirements being unknown."""

    def __init__(self, profile: Profile, platform: Platform, main_index: str, indexes: Indexes) -> None:
        self.platform, self.main_index, self.indexes = platform, main_index, indexes
        self.sources = {canonicalize_name(name): url for name, url in profile.pip.sources.items()}
        self.given: dict[str, Dist] = {}

    def stand_in(self, name: str, version: str, directory: Path) -> bool:
        """Writes the stand-in for name==version into directory; False when the profile does not say the file
        comes from an index that did not answer (the pin is then missing, not unreachable)."""
        name = canonicalize_name(name)
        source = self.sources.get(name)
        if source is None or name in self.given:
            return False
        self.indexes.probe([source])  # a step's own index is not among those the resolver was given
        if source not in self.indexes.unanswered:
            return False
        why = f"{source} did not answer ({self.indexes.unanswered[source]})"
        requires, unread = [], f"{why}: its requirements are unknown"
        public = Version(version).public
        if Version(version).local == "cpu":
            files = [f for f in self.indexes.files(self.main_index, name)
                     if f.wheel and f.version == Version(public) and f.wheel[1] & self.platform.tags]
            if files:
                requires = [r for r in requires_dist(files[0], self.indexes) if not is_cuda_requirement(r)]
                unread = f"{why}: its requirements are {self.main_index}'s {name} {public} less CUDA packages"
        Standin(name, version, requires).write(directory)
        self.given[name] = Dist(version, source, requires, unread=unread)
        return True


def missing_pin(reason: str) -> tuple[str, str] | None:
    """(name, version) of the pin uv's reason says no index it asked has, or None."""
    if found := NO_VERSION.search(reason):
        return found["name"], found["version"]
    if (found := NOT_LISTED.search(reason)) and (pin := re.search(rf"\b{re.escape(found['name'])}==([^\s,]+)", reason)):
        return found["name"], pin[1]
    return None


def steps_environment(profile: Profile, platform: Platform, resolver: UvResolver,
                      progress: Callable[[str], None], standins: StandinSupplier | None = None) -> dict[str, Dist]:
    """What the profile's steps leave on a node of platform, step by step as pip does them; a file of an
    index that did not answer takes a stand-in's place when standins supplies one."""
    environment: dict[str, Dist] = {}
    installs = iter(profile.install_steps())
    for number, step in enumerate(profile.pip.install, 1):
        if isinstance(step, InstallStep):
            requirements = next(installs).requirements
            while True:
                try:
                    resolved, _ = resolver.compile(requirements, preferred=environment)
                    break
                except LockError as exc:
                    missing = missing_pin(str(exc))
                    if not (standins and missing and standins.stand_in(*missing, resolver.standins)):
                        raise LockError(f"step {number} ({', '.join(step.requires)}) does not resolve: {exc}") from None
            for name, dist in resolved.items():
                environment[name] = standins.given.get(name, dist) if standins else dist
            progress(f"step {number}: {len(resolved)} packages for {', '.join(step.requires)}")
        elif isinstance(step, RemoveStep):
            if platform.arch in step.arch:
                for name in step.remove:
                    environment.pop(canonicalize_name(name), None)
        elif isinstance(step, OverrideStep):
            build = step.build_for(platform.arch, platform.python)
            pinned = environment.get(canonicalize_name(step.override))
            if build is None or pinned is None:
                raise LockError(f"step {number} ({step.override}): "
                                + ("no build for this platform" if build is None else "its pin is not installed"))
            pinned.build = build.file
    return environment


@dataclass
class EndState:
    """What all of a profile's steps leave together on a node of one platform, judged as the stack gate's
    `pip check` judges it: builds over pins at their own version, with their pin's requirements."""

    platform: Platform
    environment: dict[str, Dist]
    complaints: list[str]
    unaccepted: list[str]

    @property
    def unread(self) -> dict[str, Dist]:
        """The distributions whose files were not read (an index that did not answer): stand-ins took their place."""
        return {name: dist for name, dist in self.environment.items() if dist.unread}

    @property
    def builds(self) -> dict[str, Dist]:
        return {name: dist for name, dist in self.environment.items() if dist.build}


def judge_steps(profile: Profile, platform: Platform, resolver: UvResolver, indexes: Indexes,
                progress: Callable[[str], None]) -> EndState:
    """The end state of the profile's steps on platform, with stand-ins for what the indexes that did not
    answer hold; LockError when a step does not resolve."""
    standins = StandinSupplier(profile, platform, resolver.indexes[0], indexes)
    environment = steps_environment(profile, platform, resolver, progress, standins)
    read_metadata({name: dist for name, dist in environment.items() if not dist.unread}, platform, indexes)
    judged = {**environment, **{name: Dist(build_version(dist.build), dist.index, dist.requires)
                                for name, dist in environment.items() if dist.build}}
    complaints = pip_check(judged, platform)
    return EndState(platform, environment, complaints, profile.unaccepted_complaints(complaints))


def answering_indexes(profile: Profile, index_urls: list[str] | None, indexes: Indexes,
                      progress: Callable[[str], None]) -> tuple[list[str], dict[str, str]]:
    """The profile's indexes (or those given) that answer, main one first, and those left out with why."""
    urls = index_urls or [profile.pip.index_url, *profile.pip.extra_index_urls]
    if not urls or not urls[0]:
        raise FleetError(f"profile lock: profile {profile.name} names no pip index (its host data does): "
                         "give --index-url")
    indexes.probe(urls)
    if urls[0] in indexes.unanswered:
        raise LockError(f"the index {urls[0]} did not answer ({indexes.unanswered[urls[0]]})")
    unasked = {url: why for url, why in indexes.unanswered.items() if url in urls}
    for url, why in unasked.items():
        progress(f"extra index {url} left out: {why}")
    return [url for url in urls if url not in unasked], unasked


def end_state(profile: Profile, platform: Platform, index_urls: list[str] | None = None,
              progress: Callable[[str], None] = print, indexes: Indexes | None = None) -> EndState:
    """What the profile's steps leave together on platform (`profile check`'s judgement of the whole)."""
    indexes = indexes or Indexes()
    urls, _ = answering_indexes(profile, index_urls, indexes, progress)
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-lock-") as workdir:
        return judge_steps(profile, platform, UvResolver(platform, urls, profile.pip.source_builds, Path(workdir)),
                           indexes, progress)


def lock_profile(profile: Profile, platform: Platform, index_urls: list[str] | None = None,
                 progress: Callable[[str], None] = print, indexes: Indexes | None = None) -> Lock:
    """The profile's lock for platform; LockError when its steps leave a complaint it does not accept, or
    need a file of an index that did not answer (its sha256 cannot be read)."""
    indexes = indexes or Indexes()
    urls, unasked = answering_indexes(profile, index_urls, indexes, progress)
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-lock-") as workdir:
        resolver = UvResolver(platform, urls, profile.pip.source_builds, Path(workdir))
        state = judge_steps(profile, platform, resolver, indexes, progress)
        environment, complaints, builds = state.environment, state.complaints, state.builds
        if state.unaccepted:
            unexpected = state.unaccepted
            more = f" (and {len(unexpected) - 1} more: {'; '.join(unexpected[1:])})" if len(unexpected) > 1 else ""
            raise LockError(f"the steps leave `pip check` saying: {unexpected[0].rstrip('.')}{more}; accept it "
                            "in the step's `accepts` if upstream does, else change the steps")
        if state.unread:
            name, dist = next(iter(state.unread.items()))
            raise LockError(f"{name} {dist.version} comes from {dist.index}, which did not answer: its sha256 cannot "
                            "be read from here; lock where that index answers")
        overrides = complaint_overrides(complaints, environment)
        requirements = [r for step in profile.install_steps() for r in step.requirements]
        one_set, text = resolver.compile(requirements, constraints=environment, overrides=overrides, hashes=True,
                                         left_out=sorted(builds))
    moved = {name for name in one_set.keys() & environment.keys() if one_set[name].version != environment[name].version}
    if moved:
        raise LockError(f"uv's one resolution differs from the steps' environment in {', '.join(sorted(moved))}")
    # What an earlier step installed for a version a later one moved, which nothing requires any more.
    orphans = sorted(environment.keys() - one_set.keys() - builds.keys())
    progress(f"{len(one_set)} packages locked, {len(builds)} builds over pins, {len(complaints)} accepted complaints, "
             f"{len(orphans)} left behind by earlier steps and required by nothing")
    locked = {name: environment[name] for name in one_set.keys() | builds.keys()}
    header = lock_header(profile, platform, urls, unasked, overrides, complaints, builds, orphans)
    return Lock(profile, platform, locked, complaints, header + text)


def complaint_overrides(complaints: list[str], environment: dict[str, Dist]) -> list[str]:
    """The overrides that make the accepted complaints one resolution: each package a complaint says is at
    another version held at the environment's, each it says is not installed taken out."""
    overrides = {}
    for complaint in complaints:
        if match := re.search(r" has requirement (?P<requirement>.+), but you have (?P<name>\S+) ", complaint):
            overrides[match["name"]] = f"{match['name']}=={environment[match['name']].version}"
        elif match := re.search(r" requires (?P<requirement>.+), which is not installed\.$", complaint):
            name = canonicalize_name(Requirement(match["requirement"]).name)
            overrides[name] = f"{name}; {NEVER}"
    return [overrides[name] for name in sorted(overrides)]


def build_version(file: str) -> str:
    return file.split("-")[1]


def lock_header(profile: Profile, platform: Platform, urls: list[str], unasked: dict[str, str],
                overrides: list[str], complaints: list[str], builds: dict[str, Dist], orphans: list[str]) -> str:
    lines = [f"# ascend-fleet profile lock {profile.name} --arch {platform.arch} --python {platform.python} "
             f"--glibc {platform.glibc}",
             f"{DIGEST_LINE}{profile_digest(profile, platform)}",
             f"# indexes: {' '.join(urls)}",
             *(f"# left out (did not answer: {why}): {url}" for url, why in unasked.items()),
             "# what the profile's steps leave, as one set: install it with pip --require-hashes --no-deps",
             f"# overrides (the later steps' versions over the earlier steps' pins): {' '.join(overrides) or 'none'}",
             *(f"# accepted: {complaint}" for complaint in complaints),
             *(f"# then over its pin, from the profile: {dist.build}" for dist in builds.values()),
             "# left behind by earlier steps on a node, required by nothing, not locked: "
             f"{' '.join(orphans) or 'none'}"]
    return "\n".join(lines) + "\n"


def read_lock(path: Path) -> tuple[str | None, dict[str, list[str]]]:
    """The lock's profile digest and {name==version: its hashes}."""
    digest, pinned, current = None, {}, None
    for line in path.read_text().splitlines():
        if line.startswith(DIGEST_LINE):
            digest = line.removeprefix(DIGEST_LINE).strip()
        elif match := PIN.match(line):
            version = match["version"]
            current = f"{canonicalize_name(match['name'])}=={version}"
            pinned[current] = []
        elif current and (hashed := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            pinned[current].append(hashed[1])
    return digest, pinned


def lock_problems(profile: Profile, platform: Platform, path: Path) -> list[str]:
    """Why the lock at path is not this profile's for platform: stale, unhashed, or missing a pin."""
    digest, pinned = read_lock(path)
    if digest != profile_digest(profile, platform):
        return [f"{path}: made from another version of profile {profile.name} (its digest differs); "
                f"run `ascend-fleet profile lock {profile.name} --arch {platform.arch} --python {platform.python}`"]
    problems = [f"{path}: {pin} has no sha256" for pin, hashes in pinned.items() if not hashes]
    versions = dict(pin.split("==", 1) for pin in pinned)
    node = {**platform.markers(), "extra": ""}
    builds = {canonicalize_name(step.override) for step in profile.pip.install if isinstance(step, OverrideStep)}
    for step in profile.install_steps():
        for line in step.requirements:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name in builds or (requirement.marker and not requirement.marker.evaluate(node)):
                continue
            if name not in versions or not requirement.specifier.contains(versions[name], prereleases=True):
                problems.append(f"{path}: {line} is not met ({name} {versions.get(name, 'not locked')})")
    return problems


def end_state_verdicts(profile: Profile, platforms: list[Platform], index_urls: list[str] | None = None,
                       indexes: Indexes | None = None) -> tuple[list[str], int]:
    """One line per platform on what all the steps leave together, a line per `pip check` complaint the
    profile does not accept (a problem each) and per file an index that did not answer holds (a note)."""
    lines, problems, indexes = [], 0, indexes or Indexes()
    for platform in platforms:
        where = f"{profile.name} {platform}: end state"
        try:
            state = end_state(profile, platform, index_urls, lambda line: None, indexes)
        except LockError as exc:
            lines.append(f"{where}: note: not judged: {exc}")
            continue
        problems += len(state.unaccepted)
        lines += [f"{where}: `pip check` would say: {line} (not among the profile's accepts)"
                  for line in state.unaccepted]
        lines += [f"{where}: note: {name} {dist.version} judged from a stand-in: {dist.unread}"
                  for name, dist in state.unread.items()]
        accepted = len(state.complaints) - len(state.unaccepted)
        lines.append(f"{where}: {len(state.environment)} packages, {len(state.complaints)} `pip check` complaints, "
                     f"{accepted} accepted by the profile")
    return lines, problems


def lock_verdicts(profile: Profile, platforms: list[Platform]) -> tuple[list[str], int]:
    """One line per platform on its committed lock, and how many of them are problems: a lock that is not
    the profile's is one; a lock that is, or no lock, is a note (a profile whose indexes do not answer
    cannot lock)."""
    lines, problems = [], 0
    for platform in platforms:
        path = lock_path(profile.name, platform)
        if not path.exists():
            lines.append(f"{profile.name} {platform}: note: no lock ({path.name}); `ascend-fleet profile lock "
                         f"{profile.name} --arch {platform.arch} --python {platform.python}` writes one")
            continue
        found = lock_problems(profile, platform, path)
        problems += len(found)
        pinned = len(read_lock(path)[1])
        lines += [f"{profile.name} {platform}: lock {line}" for line in found] or \
            [f"{profile.name} {platform}: note: lock {path.name} accepted: {pinned} packages, each hashed, made "
             "from this profile, meeting every step's pins"]
    return lines, problems


def node_lock(profile: Profile, arch: str, python: str, locks_dir: Path | None = None) -> PipLocked | None:
    """The lock a node of arch and Python installs the profile's stack from: locks_dir's (a site's own, a
    bundle's) before the committed one; None when neither has one. Refuses a lock that is not the profile's."""
    name = lock_path(profile.name, Platform(arch, python, DEFAULT_GLIBC)).name
    path = next((p for p in ([locks_dir / name] if locks_dir else []) + [LOCKS_DIR / name] if p.exists()), None)
    if path is None:
        return None
    problems = lock_problems(profile, Platform(arch, python, DEFAULT_GLIBC), path)
    if problems:
        raise FleetError(problems[0])
    _, pinned = read_lock(path)
    return PipLocked(name, path.read_text(), dict(pin.split("==", 1) for pin in pinned),
                     [*profile.pip.extra_index_urls])


def glibc_problem(lock: PipLocked, node_glibc: str | None) -> str | None:
    """Why the lock's wheels may not load on a node with this glibc (a lock for glibc 2.35 may pin
    manylinux_2_35 wheels), or None."""
    made_for = GLIBC_IN_HEADER.search(lock.text)
    if made_for is None or node_glibc is None:
        return None
    if tuple(map(int, node_glibc.split("."))) < tuple(map(int, made_for["glibc"].split("."))):
        return (f"{lock.name} was locked for glibc {made_for['glibc']} and this node has {node_glibc}: its wheels "
                f"may not load here; lock it again with --glibc {node_glibc} (the oldest of the fleet's)")
    return None


def router_lock_path(router: Router, platform: Platform) -> Path:
    """Where a router release's lock for one platform is committed: shared by every profile that pins it."""
    return LOCKS_DIR / f"vllm-router-{router.vllm_router}.{platform.arch}-py{platform.python}.txt"


def lock_router(router: Router, platform: Platform, index_urls: list[str],
                progress: Callable[[str], None] = print) -> str:
    """The text of the router's lock for platform: its pin and every package it needs, resolved by uv for
    the platform, each with its sha256 hashes."""
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-lock-") as workdir:
        resolved, text = UvResolver(platform, index_urls, [], Path(workdir)).compile([router.requirement], hashes=True)
    progress(f"{len(resolved)} packages locked")
    header = (f"# ascend-fleet profile lock --router {router.requirement} --arch {platform.arch} "
              f"--python {platform.python} --glibc {platform.glibc}\n# indexes: {' '.join(index_urls)}\n"
              "# the gateway's vllm-router and what it needs, as one set: install it with pip --require-hashes "
              "--no-deps\n")
    return header + text


def router_lock(router: Router, arch: str, python: str, locks_dir: Path | None = None) -> PipLocked | None:
    """The lock a gateway of arch and Python installs the router from: locks_dir's (a site's own, a bundle's)
    before the committed one; None when neither has one. Refuses a lock without the router's pin or with a
    pin that has no sha256."""
    name = router_lock_path(router, Platform(arch, python, ROUTER_GLIBC)).name
    path = next((p for p in ([locks_dir / name] if locks_dir else []) + [LOCKS_DIR / name] if p.exists()), None)
    if path is None:
        return None
    _, pinned = read_lock(path)
    unhashed = [pin for pin, hashes in pinned.items() if not hashes]
    if router.requirement not in pinned or unhashed:
        raise FleetError(f"{path}: " + (f"{unhashed[0]} has no sha256" if unhashed else
                                        f"does not pin {router.requirement}") +
                         f"; run `ascend-fleet profile lock PROFILE --router --arch {arch} --python {python}`")
    return PipLocked(name, path.read_text(), dict(pin.split("==", 1) for pin in pinned), [])
