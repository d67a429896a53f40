"""`ascend-fleet profile new VERSION`: a candidate profile for a vllm-ascend release, from what the package
index shows of it, judged by `profile check` and `profile lock`, with a go / no-go report.

What the index shows is read by program, never typed: the release's files (wheel tags: Pythons, glibc,
arches; or a source archive only), its Requires-Dist (a wheel's METADATA, else the source archive's
PKG-INFO), and from its source archive, upstream's own files: the Dockerfile (the vLLM it builds on, the
indexes each pip install of the image uses, its uninstalls) and the versioning policy (where the CANN row
is). Which distributions clash is read from the resolved wheels' RECORDs: two that install the same path
with different content (torch's CUDA triton and triton-ascend both install triton/) need an uninstall
between them, as upstream's image runs one. What the index cannot tell (CANN, driver and firmware rows,
HCCL's span, the vendor .run files' sha256, builds upstream's image takes from elsewhere) is null in the
candidate, each with where an operator finds it; the profile model refuses a null there, so no deploy
takes the candidate before it is filled in.
"""

from __future__ import annotations

import io
import re
import shlex
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ascend_fleet import TEMPLATES
from ascend_fleet.config.profile import ARCHES, Packages, Profile, PythonPackages, Stack, Upstream
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.profile_check import Check, Indexes, IndexFile, Platform, check_profile, sdist_metadata
from ascend_fleet.fleet.profile_lock import (
    CUDA_PREFIXES,
    Dist,
    Lock,
    LockError,
    StandinSupplier,
    UvResolver,
    answering_indexes,
    lock_profile,
    requires_dist,
    steps_environment,
)

PROJECT = "vllm-ascend"
# The stack pins a profile names (Profile.pip_pins), as the release's Requires-Dist spells them.
STACK_PINS = {"torch": "torch", "torch-npu": "torch_npu", "transformers": "transformers"}
DOCKERFILE = "Dockerfile"
POLICY = "docs/source/community/versioning_policy.md"
INDEX_OPTIONS = ("--extra-index-url", "--extra-index", "--index-url", "-i")
# Where an operator finds each value the index cannot tell: the candidate's comment beside the null.
UNKNOWN_WHERE = {
    "driver_firmware_range": "the firmware versions the driver accepts: its version.info compatible_version_fw",
    "driver": "the HDK (driver) of this CANN: the CANN release notes' version compatibility table",
    "firmware": "the firmware published with that driver (the same HDK table)",
    "cann": "the release's row of vllm-ascend's versioning policy, then that CANN's release notes",
    "nnal": "the NNAL published with that CANN (CANN's download page)",
    "hccl_port_span": "CANN's environment variable reference for this CANN, under HCCL_IF_BASE_PORT (16 ports in "
                      "8.0's, 32 from 8.3's)",
}
PACKAGE_FILES_WHERE = ("the vendor .run files (driver, firmware, toolkit, ops/kernels, nnal) and their sha256: "
                       "Huawei's download pages for the versions above (`ascend-fleet` names the files from them)")


# --- what the index shows of a release ---------------------------------------------------------------


@dataclass
class DockerPip:
    """One pip command of upstream's Dockerfile: install or uninstall, what, with which indexes."""

    line: int
    verb: str
    targets: list[str]  # distribution names (a path's last part for `pip install -e /path/name/`)
    indexes: list[str]


@dataclass
class Dockerfile:
    """Upstream's Dockerfile as the release's source archive carries it."""

    where: str  # "vllm_ascend-V.tar.gz:Dockerfile"
    lines: list[str]

    def arg(self, name: str) -> tuple[str, int] | None:
        """An ARG's default value and its line."""
        for number, line in enumerate(self.lines, 1):
            if found := re.match(rf"\s*ARG\s+{name}=(.*)$", line):
                return found[1].strip().strip("\"'"), number
        return None

    def expand(self, text: str) -> str:
        """${NAME} and $NAME replaced by the ARG defaults the file declares."""
        def value(match: re.Match) -> str:
            declared = self.arg(match[1] or match[2])
            return declared[0] if declared else match[0]
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)

    def cite(self, line: int) -> str:
        return f"{self.where}:{line}"

    def pip_commands(self) -> list[DockerPip]:
        """Each `pip install`/`pip uninstall` of its RUN instructions, with the indexes it reads: its own
        --extra-index-url options and a PIP_EXTRA_INDEX_URL the same RUN exports."""
        commands: list[DockerPip] = []
        for pieces in self.runs():
            text = " ".join(piece for _, piece in pieces)
            starts = [0]
            for _, piece in pieces[:-1]:
                starts.append(starts[-1] + len(piece) + 1)
            exported: list[str] = []
            offset = 0
            for command in re.split(r"&&|;|\|\|", text):
                line = pieces[max(i for i, start in enumerate(starts) if start <= offset + len(command)
                                  - len(command.lstrip()))][0]
                offset += len(command) + 2
                try:
                    words = shlex.split(self.expand(command))
                except ValueError:
                    continue
                exported += [w.split("=", 1)[1] for w in words if w.startswith("PIP_EXTRA_INDEX_URL=")]
                if "pip" not in words:
                    continue
                verb_at = words.index("pip") + 1
                if verb_at >= len(words) or words[verb_at] not in ("install", "uninstall"):
                    continue
                targets, indexes, skip = [], [], False
                for i, word in enumerate(words[verb_at + 1:], verb_at + 1):
                    if skip:
                        skip = False
                    elif word in INDEX_OPTIONS:
                        indexes.append(words[i + 1] if i + 1 < len(words) else "")
                        skip = True
                    elif not word.startswith("-"):
                        targets.append(target_name(word))
                commands.append(DockerPip(line, words[verb_at], targets, [*exported, *indexes]))
        return commands

    def runs(self) -> list[list[tuple[int, str]]]:
        """Each RUN instruction as its physical lines (number, text less the continuation backslash)."""
        runs, current = [], None
        for number, line in enumerate(self.lines, 1):
            if current is None and not re.match(r"\s*RUN\s", line):
                continue
            current = current or []
            continued = line.rstrip().endswith("\\")
            current.append((number, line.rstrip()[:-1] if continued else line))
            if not continued:
                runs.append(current)
                current = None
        return runs

    def installs_of(self, name: str) -> DockerPip | None:
        return next((c for c in self.pip_commands() if c.verb == "install" and canonicalize_name(name) in
                     {canonicalize_name(t) for t in c.targets}), None)

    def other_builds(self) -> list[str]:
        """The lines that install wheels or run scripts rather than install from an index: builds the image
        takes from elsewhere (object storage, release pages), which no index tells of."""
        return [f"{self.cite(n)}: {line.strip()[:110]}" for n, line in enumerate(self.lines, 1)
                if re.search(r"\.whl\b|\bbash\s+\S+\.sh\b", line) and not line.lstrip().startswith("#")]


def target_name(word: str) -> str:
    """The distribution a pip argument installs: a requirement's name, or a path's last part."""
    try:
        return Requirement(word).name
    except InvalidRequirement:
        return re.sub(r"\[.*\]$", "", word.rstrip("/")).rstrip("/").rsplit("/", 1)[-1]


@dataclass
class Release:
    """A vllm-ascend release as the index shows it."""

    version: str
    index_url: str
    wheels: list[IndexFile]
    sdist: IndexFile | None
    requires: list[str]
    requires_from: str  # which file's metadata, and what to make of it
    pythons: list[str]
    pythons_from: str
    dockerfile: Dockerfile | None
    policy_row: tuple[str, int] | None  # the versioning policy's line for the release, and its line number

    @cached_property
    def exact_pins(self) -> dict[str, str]:
        """The version each `==V` requirement of the release (no marker) names, by distribution: the first's."""
        pins: dict[str, str] = {}
        for line in self.requires:
            requirement = Requirement(line)
            specs = list(requirement.specifier)
            if len(specs) == 1 and specs[0].operator == "==" and not requirement.marker:
                pins.setdefault(canonicalize_name(requirement.name), specs[0].version)
        return pins

    def pin(self, name: str) -> str | None:
        """The version an `==V` requirement of the release names for a distribution."""
        return self.exact_pins.get(canonicalize_name(name))


def newest_prerelease(indexes: Indexes, index_url: str) -> str:
    """The newest release candidate (pre-release) of vllm-ascend the index lists."""
    versions = {f.version for f in indexes.files(index_url, PROJECT) if f.version is not None}
    pre = sorted(v for v in versions if v.is_prerelease)
    if not pre:
        raise FleetError(f"profile new: {index_url} lists no pre-release of {PROJECT}; give a VERSION")
    return str(pre[-1])


def read_release(indexes: Indexes, index_url: str, version: str) -> Release:
    """The release's files, Requires-Dist, Pythons and upstream's files from its source archive."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise FleetError(f"profile new: VERSION {version!r} is not a version (e.g. 0.23.0.post1)") from None
    files = [f for f in indexes.files(index_url, PROJECT) if f.version == wanted]
    if not files:
        near = sorted({f.version for f in indexes.files(index_url, PROJECT) if f.version}, reverse=True)[:8]
        raise FleetError(f"profile new: {index_url} has no {PROJECT} {version}; newest there: "
                         f"{', '.join(map(str, near)) or 'none'}")
    wheels = [f for f in files if f.wheel]
    sdist = next((f for f in files if not f.wheel), None)
    archive = indexes.fetch(sdist) if sdist else None
    if wheels:
        chosen = wheels[0]
        requires, requires_from = requires_dist(chosen, indexes), f"{chosen.filename} METADATA"
        pythons = sorted({t.interpreter[2] + "." + t.interpreter[3:] for f in wheels for t in f.wheel[1]
                          if t.interpreter.startswith("cp")}, key=Version)
        pythons_from = "its wheels' tags"
    else:
        info = sdist_metadata(archive) if archive else None
        if info is None:
            raise FleetError(f"profile new: {sdist.filename} has no PKG-INFO: its requirements are unknown")
        requires = info.get_all("Requires-Dist") or []
        dynamic = "requires-dist" in {d.lower() for d in info.get_all("Dynamic", [])}
        requires_from = (f"{sdist.filename} PKG-INFO (no wheel on the index: pip builds it on the node"
                         + ("; PKG-INFO calls its requirements Dynamic, so the build may change them)" if dynamic
                            else ")"))
        pythons = classifier_pythons(info.get_all("Classifier") or [], info.get("Requires-Python"))
        pythons_from = f"{sdist.filename} PKG-INFO classifiers within Requires-Python {info.get('Requires-Python')}"
    dockerfile, policy = (upstream_files(archive, sdist.filename, version) if archive else (None, None))
    return Release(version, index_url, wheels, sdist, requires, requires_from, pythons, pythons_from, dockerfile,
                   policy)


def classifier_pythons(classifiers: list[str], requires_python: str | None) -> list[str]:
    found = [m[1] for c in classifiers if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))]
    allowed = SpecifierSet(requires_python or "")
    return sorted({p for p in found if allowed.contains(p)}, key=Version)


def upstream_files(archive: bytes, filename: str, version: str) -> tuple[Dockerfile | None, tuple[str, int] | None]:
    """The Dockerfile and the versioning policy's row for the release, from the source archive."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name and m.isfile()}
        read = {name: tar.extractfile(members[name]).read().decode(errors="replace")
                for name in (DOCKERFILE, POLICY) if name in members}
    dockerfile = Dockerfile(f"{filename}:{DOCKERFILE}", read[DOCKERFILE].splitlines()) if DOCKERFILE in read else None
    policy = None
    for number, line in enumerate(read.get(POLICY, "").splitlines(), 1):
        if re.match(rf"\|\s*v{re.escape(version)}\s*\|", line):
            policy = (" ".join(line.split()), number)
            break
    return dockerfile, policy


# --- which distributions clash ---------------------------------------------------------------------


@dataclass
class Clash:
    """Two distributions that install the same paths with different content."""

    first: str  # name of the one installed earlier (the step-1 side)
    second: str
    versions: tuple[str, str]
    modules: list[str]  # the top-level names they share
    paths: int  # how many paths differ


class RecordReader:
    """The RECORD of the wheel a node of platform installs, each read once: {path: hash}."""

    def __init__(self, indexes: Indexes, main_index: str) -> None:
        self.indexes, self.main_index = indexes, main_index
        self.read: dict[str, dict[str, str]] = {}

    def record(self, name: str, dist: Dist, platform: Platform) -> tuple[dict[str, str] | None, str | None]:
        """The paths and hashes, and a note when they are another release's (the file's index did not answer:
        the nearest release the main index has for the platform stands in); None when nothing can be read."""
        note = None
        wheel = self.wheel_for(dist.index, name, Version(dist.version), platform) if not dist.unread else None
        if wheel is None and dist.unread:
            near = [f for f in self.indexes.files(self.main_index, name) if f.wheel and f.wheel[1] & platform.tags]
            wheel = max(near, key=lambda f: f.version, default=None)
            if wheel is None:
                return None, f"{name} {dist.version}: not read ({dist.unread}), and the main index has no release"
            note = (f"{name} {dist.version}'s files are not readable here ({dist.unread}); {wheel.filename} "
                    f"from {self.main_index} stands in for them")
        if wheel is None:
            return None, None
        if wheel.url not in self.read:
            with zipfile.ZipFile(io.BytesIO(self.indexes.fetch(wheel))) as archive:
                record = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
                rows = archive.read(record).decode().splitlines()
            self.read[wheel.url] = {row.split(",")[0]: row.split(",")[1] for row in rows if row.count(",") >= 2}
        return self.read[wheel.url], note

    def wheel_for(self, index: str, name: str, version: Version, platform: Platform) -> IndexFile | None:
        files = [f for f in self.indexes.files(index or self.main_index, name) if f.wheel and f.version == version]
        return next((f for f in files if f.wheel[1] & platform.tags), None)


def installed_path(path: str) -> str | None:
    """Where a RECORD path lands in site-packages; None for the distribution's own metadata and scripts."""
    parts = path.split("/")
    if parts[0].endswith(".dist-info"):
        return None
    if parts[0].endswith(".data"):
        return "/".join(parts[2:]) if len(parts) > 2 and parts[1] in ("purelib", "platlib") else None
    return path


def clashes(earlier: dict[str, Dist], later: dict[str, Dist], platform: Platform, reader: RecordReader,
            notes: list[str]) -> list[Clash]:
    """The pairs (one of `earlier`, one new in `later` or both in `later`) that install a path with different
    content. NVIDIA's CUDA libraries are not read (their `nvidia/` namespace is shared by design, and they
    are gigabytes); a distribution whose RECORD cannot be read is said so in notes."""
    owners: dict[str, dict[str, str]] = {}  # path -> {name: hash}
    everyone = {**earlier, **later}
    for name, dist in sorted(everyone.items()):
        if name.startswith(CUDA_PREFIXES):
            continue
        record, note = reader.record(name, dist, platform)
        if note:
            notes.append(note)
        for path, digest in (record or {}).items():
            if (placed := installed_path(path)) is not None and not placed.endswith(".pyc"):
                owners.setdefault(placed, {})[name] = digest
    found: dict[tuple[str, str], Clash] = {}
    for path, by in owners.items():
        if len(by) < 2 or len(set(by.values())) < 2:
            continue  # one owner, or the same bytes (a namespace package's empty __init__.py)
        if "/" not in path:  # a stray file at site-packages' top (two wheels' build_backend.py): no package
            notes.append(f"{' and '.join(sorted(by))} both install {path} at site-packages' top, no package of "
                         "either: left as it is")
            continue
        names = sorted(by, key=lambda n: (n not in earlier, n))
        first, second = names[0], names[1]
        clash = found.setdefault((first, second), Clash(first, second, (everyone[first].version,
                                                                         everyone[second].version), [], 0))
        clash.paths += 1
        module = path.split("/", 1)[0]
        if module not in clash.modules:
            clash.modules.append(module)
    return list(found.values())


# --- the candidate -----------------------------------------------------------------------------------


@dataclass
class Candidate:
    """The candidate profile's data (what the template writes) and the facts behind it, each cited."""

    name: str
    data: dict
    whys: list[str]  # per pip.install step: why it is there, and its Dockerfile line
    facts: list[str]  # "what: value (source)"
    unknowns: list[str]  # "key: where to find it"
    problems: list[str]  # found while writing it, before check and lock (each a no-go reason)
    notes: list[str]

    def profile(self) -> Profile:
        """The candidate as a Profile for `profile check` and `profile lock`, which read only its pip section
        and pins: its stack keeps the unknown (null) vendor rows, which nothing on this path reads; a
        deploy reads the file, which the profile model refuses until they are filled in."""
        return pip_judged(self.data)


def pip_judged(data: dict) -> Profile:
    """A profile's data as `profile check` and `profile lock` judge it: every part validated but the stack,
    whose vendor rows may be null (unknown); its pins are the release's."""
    parts = {"upstream": Upstream.model_validate(data["upstream"]), "packages": Packages.model_validate(data["packages"]),
             "pip": PythonPackages.model_validate(data["pip"]), "stack": Stack.model_construct(**data["stack"])}
    return Profile.model_construct(**{**data, **parts, "known_issues": [], "router": None})


@dataclass
class Judges:
    """What judges a candidate: the steps' environment (profile_lock.steps_environment), `profile check` and
    `profile lock`; the command passes the real ones, tests their fakes."""

    environment: Callable[[Profile, Platform], dict[str, Dist]]
    check: Callable[[Profile, list[Platform]], Check]
    lock: Callable[[Profile, Platform], Lock]


def real_judges(indexes: Indexes, progress: Callable[[str], None]) -> Judges:
    """The judges the command runs: uv's steps, `profile check`'s pip and `profile lock`, on the pages read so far."""
    def environment(profile: Profile, platform: Platform) -> dict[str, Dist]:
        urls, _ = answering_indexes(profile, None, indexes, lambda line: None)
        with tempfile.TemporaryDirectory(prefix="ascend-fleet-new-") as workdir:
            resolver = UvResolver(platform, urls, profile.pip.source_builds, Path(workdir))
            return steps_environment(profile, platform, resolver, lambda line: None,
                                     StandinSupplier(profile, platform, urls[0], indexes))

    return Judges(environment,
                  lambda profile, platforms: check_profile(profile, platforms, None, progress, indexes),
                  lambda profile, platform: lock_profile(profile, platform, None,
                                                         lambda line: progress(f"{platform}: {line}"), indexes))


def draft(name: str, release: Release, stack: dict, steps: list[dict], sources: dict[str, str],
          source_builds: list[str], arches: list[str], index_url: str) -> dict:
    return {"name": name, "summary": f"candidate for vllm-ascend {release.version} (ascend-fleet profile new): "
                                     "vendor rows unknown until filled in",
            "upstream": {"vllm_ascend_row": release.version, "note": "written by `ascend-fleet profile new` from "
                                                                     f"{index_url}; not reviewed"},
            "arch": arches, "stack": stack, "packages": {"source": "files", "files": {}},
            "pip": {"index_url": index_url, "extra_index_urls": [], "install": steps, "sources": sources,
                    "source_builds": source_builds}}


def qualify_candidate(release: Release, python: str, glibc: str, indexes: Indexes, judges: Judges,
                      progress: Callable[[str], None]) -> Candidate:
    """The candidate profile of the release: stack pins, steps with their indexes, sources, source builds,
    and the uninstalls the clashing distributions need, found by resolving the steps on each arch."""
    facts, unknowns, problems, notes = [], [], [], []
    docker = release.dockerfile
    name = f"{PROJECT}-{release.version}"
    facts.append(f"vllm-ascend {release.version}: {wheels_said(release)}")
    facts.append(f"requirements: {release.requires_from}")
    vllm = docker.arg("VLLM_TAG") if docker else None
    if vllm:
        facts.append(f"vllm {vllm[0].lstrip('v')} (upstream's image builds on it: ARG VLLM_TAG, {docker.cite(vllm[1])})")
    else:
        problems.append("vllm: unknown (the release's source archive has no Dockerfile with ARG VLLM_TAG); "
                        "give it from the release's versioning-policy row")
    pins = {key: release.pin(dist) for dist, key in STACK_PINS.items()}
    for dist, key in STACK_PINS.items():
        if pins[key]:
            facts.append(f"{dist} {pins[key]} (the release's Requires-Dist)")
        else:
            problems.append(f"{dist}: unknown (the release's Requires-Dist pins no single version of it)")
    triton_ascend = release.pin("triton-ascend")
    if triton_ascend:
        facts.append(f"triton-ascend {triton_ascend} (the release's Requires-Dist)")
    if python not in release.pythons:
        problems.append(f"Python {python} is not among the release's ({', '.join(release.pythons)}, from "
                        f"{release.pythons_from}); give --python one of those")
    facts.append(f"Python {', '.join(release.pythons)} ({release.pythons_from}); the candidate takes {python}")
    arches, glibc_said = release_arches(release, pins["torch_npu"], python, indexes)
    facts.append(f"arch {', '.join(arches) or 'none'}; glibc: {glibc_said}")
    if not arches:
        problems.append(f"no arch: neither the release nor torch-npu {pins['torch_npu']} has a wheel for Python "
                        f"{python} on {', '.join(ARCHES)}")
    if release.policy_row:
        row, line = release.policy_row
        notes.append(f"versioning policy ({release.sdist.filename}:{POLICY}:{line}): {row}")
    if docker:
        notes += [f"upstream's image installs a build no index lists: {line}" for line in docker.other_builds()]

    stack = {"driver": None, "driver_firmware_range": None, "firmware": None, "cann": None, "nnal": None,
             "hccl_port_span": None, "python": python, "torch": pins["torch"], "torch_npu": pins["torch_npu"],
             "vllm": vllm[0].lstrip("v") if vllm else None, "vllm_ascend": release.version,
             "transformers": pins["transformers"]}
    unknowns += [f"stack.{key}: {where}" for key, where in UNKNOWN_WHERE.items()]
    unknowns.append(f"packages.files: {PACKAGE_FILES_WHERE}")
    sources, unsourced = pin_sources(release, indexes)
    problems += unsourced
    source_builds = sorted(name for name in [PROJECT, *release.exact_pins]
                           if not has_wheel(indexes, release.index_url, name,
                                            release.version if name == PROJECT else release.exact_pins[name],
                                            python, arches))
    if problems and any(stack[key] is None for key in ("vllm", "torch", "torch_npu", "transformers")):
        return Candidate(name, {}, [], facts, unknowns, problems, notes)

    first = install_step(["vllm"], docker, "vllm", "the image installs vLLM first")
    second = install_step(["vllm-ascend", "torch", "torch-npu", "transformers"], docker, PROJECT,
                          "then vllm-ascend with the torch and torch-npu it pins")
    steps, step_arches = [first, second], {}
    for arch in arches:
        platform = Platform(arch, python, glibc)
        proposed = propose_removals(name, release, stack, [first, second], sources, source_builds, arches, platform,
                                    indexes, judges, notes, progress)
        if isinstance(proposed, str):
            problems.append(proposed)
            continue
        step_arches[arch] = proposed
    steps = merge_removals(first, second, step_arches, docker, facts)
    data = draft(name, release, stack, [without_why(s) for s in steps], sources, source_builds, arches,
                 release.index_url)
    return Candidate(name, data, [step["why"] for step in steps], facts, unknowns, problems, notes)


def wheels_said(release: Release) -> str:
    if release.wheels:
        return f"{len(release.wheels)} wheels{' and ' + release.sdist.filename if release.sdist else ''}"
    return f"{release.sdist.filename} only (no wheel: pip builds it on the node, with CANN's compilers)"


def release_arches(release: Release, torch_npu: str | None, python: str, indexes: Indexes) -> tuple[list[str], str]:
    """The arches a node of python can install the release on, and the glibc its wheels need: the release's
    own wheels, else (a source archive only) torch-npu's, which every build of it needs."""
    said = []
    sets = [(PROJECT, release.version, release.wheels)] if release.wheels else []
    if torch_npu:
        sets.append(("torch-npu", torch_npu, [f for f in indexes.files(release.index_url, "torch-npu")
                                              if f.wheel and f.version == Version(torch_npu)]))
    arches: list[str] | None = None
    for dist, version, wheels in sets:
        tagged = [t for f in wheels for t in f.wheel[1] if t.interpreter == f"cp{python.replace('.', '')}"
                  or t.interpreter.startswith("py3")]
        have = [a for a in ARCHES if any(t.platform.endswith(f"_{a}") for t in tagged)]
        glibcs = sorted({m[0] for t in tagged if (m := re.search(r"manylinux_2_\d+|manylinux2014", t.platform))})
        said.append(f"{dist} {version} {'/'.join(glibcs) or 'no Linux wheel'} ({', '.join(have) or 'no arch'})")
        arches = have if arches is None else [a for a in arches if a in have]
    return arches or [], "; ".join(said) or "unknown"


def has_wheel(indexes: Indexes, index_url: str, name: str, version: str, python: str, arches: list[str]) -> bool:
    """Whether the index has a wheel of name==version for python on every arch (else pip builds its source)."""
    files = [f for f in indexes.files(index_url, name) if f.version == Version(version)]
    if not files:
        return True  # not on this index at all: its source (pip.sources) decides, not a build
    wheels = [f for f in files if f.wheel]
    return all(any(f.wheel[1] & Platform(arch, python, "2.35").tags for f in wheels) for arch in arches)


def pin_sources(release: Release, indexes: Indexes) -> tuple[dict[str, str], list[str]]:
    """For each exact pin the main index lacks: the index upstream's Dockerfile installs it from by name
    (pip.sources); a problem line for one that no line names."""
    sources, problems = {}, []
    for name, version in release.exact_pins.items():
        if any(f.version == Version(version) for f in indexes.files(release.index_url, name)):
            continue
        command = release.dockerfile.installs_of(name) if release.dockerfile else None
        others = [url for url in (command.indexes if command else []) if url != release.index_url]
        if others:
            sources[name] = others[0]
        else:
            problems.append(f"{name}=={version} (the release's pin) is not on {release.index_url}, and upstream's "
                            "Dockerfile installs it from no named index: where it comes from is unknown")
    return sources, problems


def install_step(requires: list[str], docker: Dockerfile | None, target: str, why: str) -> dict:
    """An install step with the extra indexes upstream's image uses for the pip install of target."""
    command = docker.installs_of(target) if docker else None
    step = {"requires": requires, "extra_index_urls": list(dict.fromkeys(command.indexes)) if command else []}
    step["why"] = f"{why} ({docker.cite(command.line)})" if command else f"{why} (no Dockerfile line installs {target})"
    return step


def propose_removals(name: str, release: Release, stack: dict, steps: list[dict], sources: dict[str, str],
                     source_builds: list[str], arches: list[str], platform: Platform, indexes: Indexes,
                     judges: Judges, notes: list[str], progress: Callable[[str], None]) -> list[tuple] | str:
    """On one platform: the clashes after the first install and after the second, as
    [(after step, names to uninstall, reinstall name==version or None, clash)]; a problem line when the steps
    do not resolve."""
    def environment(step_list: list[dict]) -> dict[str, Dist]:
        named = {url for step in step_list for url in step.get("extra_index_urls", [])}
        data = draft(name, release, stack, [without_why(s) for s in step_list],
                     {dist: url for dist, url in sources.items() if url in named}, source_builds, arches,
                     release.index_url)
        return judges.environment(pip_judged(data), platform)

    reader = RecordReader(indexes, release.index_url)
    try:
        after_first = environment(steps[:1])
        after_second = environment(steps)
    except LockError as exc:
        return f"{platform}: the draft's steps do not resolve, so its clashes are unknown there: {exc}"
    progress(f"{platform}: reading the RECORDs of {len(after_first.keys() | after_second.keys())} distributions")
    found = clashes(after_first, after_second, platform, reader, notes)
    removals = []
    for clash in found:
        if clash.first in after_first and clash.second not in after_first:
            removals.append((1, [clash.first], None, clash))
    if removals:
        removed = steps[:1] + [{"remove": [n for r in removals for n in r[1]]}] + steps[1:]
        after = environment(removed)
        for clash in clashes({}, after, platform, reader, []):
            pinned = [name for name in (clash.first, clash.second) if name in release.exact_pins]
            if pinned:  # both go, and the one the release pins comes back alone
                removals.append((2, [clash.first, clash.second], f"{pinned[0]}=={after[pinned[0]].version}", clash))
            else:
                notes.append(f"{platform}: {clash_said(clash, None, ())}, neither pinned by the release: left")
    return removals


def without_why(step: dict) -> dict:
    return {k: v for k, v in step.items() if k != "why"}


def merge_removals(first: dict, second: dict, by_arch: dict[str, list[tuple]], docker: Dockerfile | None,
                   facts: list[str]) -> list[dict]:
    """The steps, with each arch's uninstalls (an `arch` list where they differ) and the reinstall after them."""
    steps = [first]
    for position in (1, 2):
        removals: dict[tuple[str, ...], list[str]] = {}
        clash_of: dict[tuple[str, ...], tuple] = {}
        for arch, proposed in by_arch.items():
            for after, names, reinstall, clash in proposed:
                if after == position:
                    removals.setdefault(tuple(names), []).append(arch)
                    clash_of[tuple(names)] = (reinstall, clash)
        for names, on in removals.items():
            reinstall, clash = clash_of[names]
            step = {"remove": list(names), "why": clash_said(clash, docker, names)}
            if set(on) != set(by_arch):
                step["arch"] = on
            steps.append(step)
            facts.append(f"uninstall {' '.join(names)} after step {len(steps) - 1}: {step['why']}")
            if reinstall:
                target = Requirement(reinstall).name
                steps.append(install_step([reinstall], docker, target, f"{target} alone comes back"))
        if position == 1:
            steps.append(second)
    return steps


def clash_said(clash: Clash, docker: Dockerfile | None, names: tuple[str, ...]) -> str:
    said = (f"{clash.first} {clash.versions[0]} and {clash.second} {clash.versions[1]} both install "
            f"{', '.join(m + '/' for m in clash.modules[:3])} ({clash.paths} files with different content)")
    agrees = [c for c in (docker.pip_commands() if docker else []) if c.verb == "uninstall"
              and {canonicalize_name(n) for n in names} <= {canonicalize_name(t) for t in c.targets}]
    if agrees:
        said += f"; upstream's image uninstalls the same ({docker.cite(agrees[0].line)})"
    return said


# --- check, lock, report -----------------------------------------------------------------------------


@dataclass
class Report:
    candidate: Candidate
    path: Path | None
    check_lines: list[str]
    locks: list[str]
    reasons: list[str]
    seconds: float

    @property
    def go(self) -> bool:
        return not self.reasons

    def lines(self) -> list[str]:
        """The report, one screen: the verdict, what the index showed, what is unknown, check and lock, and
        each no-go reason in one line."""
        c = self.candidate
        return [f"profile new {c.name}: {'GO' if self.go else 'NO-GO'} ({self.seconds:.0f} s)",
                f"candidate: {self.path}" if self.path else "candidate: not written (a stack pin is unknown)",
                "from the index:", *(f"  {fact}" for fact in c.facts),
                "unknown (null in the candidate: a deploy refuses it until filled in):",
                *(f"  {u}" for u in c.unknowns),
                *(["notes:"] if c.notes else []), *(f"  {note}" for note in c.notes),
                "profile check:", *(f"  {line}" for line in self.check_lines),
                "profile lock:", *(f"  {line}" for line in self.locks),
                "go" if self.go else "no-go:", *(f"  - {reason}" for reason in self.reasons)]


def write_candidate(candidate: Candidate, directory: Path) -> Path:
    """The candidate's YAML (templates/profile-candidate.yaml.j2), each step and null with its comment."""
    path = directory / f"{candidate.name}.yaml"
    text = render(TEMPLATES / "profile-candidate.yaml.j2", data=candidate.data, whys=candidate.whys,
                  where=UNKNOWN_WHERE, package_files=PACKAGE_FILES_WHERE, facts=candidate.facts)
    if yaml.safe_load(text) != candidate.data:
        raise FleetError(f"profile new: {path}: the template did not write the candidate's data back")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def judge(candidate: Candidate, platforms: list[Platform], judges: Judges, indexes: Indexes,
          directory: Path | None, started: float) -> Report:
    """`profile check` and `profile lock` of the candidate (its locks beside it, in locks/), and the no-go
    reasons, one line each: what the candidate could not know, an index not reachable, each problem the
    check finds, each platform that does not lock."""
    reasons = [*candidate.problems]
    if not candidate.data:
        return Report(candidate, None, [], [], reasons, time.monotonic() - started)
    path = write_candidate(candidate, directory) if directory else None
    reasons += [f"{unknown.split(':', 1)[0]} unknown: a deploy refuses the candidate until it is filled in"
                for unknown in candidate.unknowns]
    profile = candidate.profile()
    check = judges.check(profile, platforms)
    reasons += [f"index {url} not reachable ({why})" for url, why in indexes.unanswered.items()]
    reasons += [f"profile check {result.platform}{f' step {step.number}' if step.number else ''}: {problem.message}"
                for result in check.platforms for step in result.steps for problem in step.problems]
    reasons += [f"profile check {result.platform}: {result.refused}" for result in check.platforms if result.refused]
    locks = []
    for platform in platforms:
        try:
            made = judges.lock(profile, platform)
        except LockError as exc:
            locks.append(f"{platform}: not locked: {exc}")
            reasons.append(f"profile lock {platform}: {exc}")
            continue
        written = ""
        if directory:
            lock_file = directory / "locks" / f"{candidate.name}.{platform.arch}-py{platform.python}.txt"
            made.write(lock_file)
            written = f" ({lock_file})"
        locks.append(f"{platform}: {len(made.environment)} packages, {len(made.complaints)} accepted complaints"
                     + written)
    return Report(candidate, path, check.lines(), locks, reasons, time.monotonic() - started)
