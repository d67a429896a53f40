"""`ascend-fleet profile check`: whether each pip install of a profile resolves on a node's platform.

pip's own resolver decides: each install step (`Profile.install_steps`) is a `pip install --dry-run`
for the node's architecture, Python and glibc, against the profile's indexes (or those given),
with pip cut off from this machine's pip configuration so that only those indexes count. When pip
fails, the indexes' project pages say why, in one line: a pin no index has, wheels that do not
cover the platform, a conflict, a package the profile takes from an index that did not answer.
A package the profile says comes from elsewhere (`pip.sources`) or is built on the node
(`pip.source_builds`) is replaced by a stand-in wheel and the step resolved again, so one run
shows every problem of a step up to the first one the profile does not explain.
"""

from __future__ import annotations

import email.message
import email.parser
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from ascend_fleet.config.profile import ARCHES, InstallStep, OverrideStep, PipStep, Profile, RemoveStep
from ascend_fleet.core.errors import FleetError
from ascend_fleet.operations.python_stack import index_options

# Ubuntu 22.04's glibc: vllm-ascend's own images are built FROM quay.io/ascend/cann:<cann>-910b-ubuntu22.04-py3.x
# (its Dockerfile at v0.11.0, v0.13.0, v0.18.0 and v0.23.0).
DEFAULT_GLIBC = "2.35"
MANYLINUX2014_MINOR = 17  # glibc 2.17; older wheels carry the legacy names below
LEGACY_MANYLINUX = ("manylinux2014", "manylinux2010", "manylinux1")
PROBE_TIMEOUT = 5.0  # seconds: an index that does not answer a HEAD by then is reported, and left out
PAGE_TIMEOUT = 60.0
PIP_TIMEOUT = 900  # seconds for one resolver run; a whole vLLM stack takes about a minute
# The resolver the check runs, pinned: pip before 25.3 downloads every wheel of a dry run in full
# (gigabytes for a vLLM stack, even with fast-deps), and the check reads its messages.
RESOLVER_PIP = ("26.3", "f3b60b20ffaadd4415ed7957212a38ac63fa4c5fa375bd0f4a797777940fad13")
# pip evaluates environment markers (`platform_machine == "x86_64"`, `python_version < "3.12"`) against
# the interpreter running it, whatever --platform and --python-version say: this runs the pinned pip
# with the node's marker environment instead (argv: the pip wheel, the markers as JSON, pip's arguments).
PIP_BOOTSTRAP = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pip._vendor.packaging import markers
node, host = json.loads(sys.argv[2]), markers.default_environment
markers.default_environment = lambda: {**host(), **node}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[3:]))
"""
WORKERS = 2  # resolvers at once: a run is about half network, half CPU
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
NOT_FOUND = re.compile(r"Could not find a version that satisfies the requirement (?P<requirement>\S+)"
                       r"(?: \(from (?!versions:)(?P<parent>[^)]*)\))?")
CONFLICT_LINE = re.compile(r"^(?:The user requested (?:\(constraint\) )?|(?P<parent>\S+ \S+) depends on )"
                           r"(?P<requirement>.+)$")
NEAR_VERSIONS = 12  # versions listed for a pin no index has


def pip_environment(environ: dict[str, str]) -> dict[str, str]:
    """environ without pip's own settings: no PIP_* variable, no pip config file (this machine's
    add find-links, local indexes and a torch constraint, which would answer in the index's place)."""
    return {**{k: v for k, v in environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def manylinux_platforms(arch: str, glibc_minor: int) -> list[str]:
    """The manylinux tags a Python on glibc 2.<glibc_minor> accepts, newest first (pip does not expand
    manylinux_2_x itself)."""
    current = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, MANYLINUX2014_MINOR - 1, -1)]
    return current + [f"{legacy}_{arch}" for legacy in LEGACY_MANYLINUX]


@dataclass(frozen=True)
class Platform:
    """A node's interpreter, as pip's --platform, --python-version and --abi name it."""

    arch: str
    python: str
    glibc: str

    def __str__(self) -> str:
        return f"{self.arch} Python {self.python} glibc {self.glibc}"

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def platform_tags(self) -> list[str]:
        return manylinux_platforms(self.arch, int(self.glibc.split(".")[1]))

    def pip_options(self) -> list[str]:
        # Wheels only: pip cannot judge a source distribution for another platform.
        return ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python, "--abi", self.abi,
                *(f"--platform={tag}" for tag in self.platform_tags)]

    def markers(self) -> dict[str, str]:
        """The environment markers of this CPython on Linux (patch release: the minor's first)."""
        full = f"{self.python}.0"
        return {"implementation_name": "cpython", "implementation_version": full, "os_name": "posix",
                "platform_machine": self.arch, "platform_python_implementation": "CPython",
                "platform_system": "Linux", "python_full_version": full, "python_version": self.python,
                "sys_platform": "linux"}

    @cached_property
    def tags(self) -> frozenset[Tag]:
        """Every wheel tag this interpreter installs, as pip computes them."""
        version = tuple(int(part) for part in self.python.split("."))
        return frozenset([*cpython_tags(version, [self.abi], self.platform_tags),
                          *compatible_tags(version, self.abi, self.platform_tags)])


def platforms_to_check(profile: Profile, arch: str | None, python: str | None, glibc: str) -> list[Platform]:
    """The platforms to check: one arch or every arch the profile lists; refuses a malformed version."""
    if arch is not None and arch not in profile.arch:
        raise FleetError(f"profile check: --arch {arch}: profile {profile.name} lists {', '.join(profile.arch)}; "
                         "give one of those")
    python = python or profile.stack.python
    node_interpreter("profile check", python, glibc)
    return [Platform(a, python, glibc) for a in ([arch] if arch else profile.arch)]


def node_interpreter(command: str, python: str, glibc: str) -> None:
    """Refuses a malformed --python or --glibc of the command, in one line."""
    if not re.fullmatch(r"3\.\d+", python):
        raise FleetError(f"{command}: --python {python}: give the nodes' Python as 3.Y, e.g. 3.11")
    if not re.fullmatch(r"2\.\d+", glibc) or int(glibc.split(".")[1]) < MANYLINUX2014_MINOR:
        raise FleetError(f"{command}: --glibc {glibc}: give the nodes' glibc as 2.Y, at least 2.17 "
                         "(`ldd --version` on a node)")


@dataclass(frozen=True)
class IndexFile:
    """One file an index lists for a project."""

    filename: str
    url: str
    requires_python: str | None
    has_metadata: bool = False  # the index serves its metadata at url + ".metadata" (PEP 658/714)

    @cached_property
    def wheel(self) -> tuple[Version, frozenset[Tag]] | None:
        try:
            _, version, _, tags = parse_wheel_filename(self.filename)
        except InvalidWheelFilename:
            return None
        return version, tags

    @cached_property
    def version(self) -> Version | None:
        if self.wheel:
            return self.wheel[0]
        try:
            return parse_sdist_filename(self.filename)[1]
        except InvalidSdistFilename:
            return None


class _AnchorParser(HTMLParser):
    """The files of a PEP 503 project page: each anchor's text, href and data-requires-python."""

    def __init__(self, page_url: str) -> None:
        super().__init__()
        self.page_url, self.files, self._anchor = page_url, [], None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._anchor = dict(attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._anchor and self._anchor.get("href"):
            url = urljoin(self.page_url, self._anchor["href"])
            metadata = self._anchor.get("data-core-metadata") or self._anchor.get("data-dist-info-metadata")
            self.files.append(IndexFile(unquote(urlsplit(url).path.rsplit("/", 1)[-1]), url,
                                        self._anchor.get("data-requires-python"),
                                        metadata not in (None, "false")))
        self._anchor = None


class Indexes:
    """The package indexes as the check sees them: which answered, and their project pages, each read once."""

    def __init__(self) -> None:
        self.session = requests.Session()
        self.unanswered: dict[str, str] = {}
        self._probed: set[str] = set()
        self._pages: dict[tuple[str, str], list[IndexFile]] = {}
        self._lock = threading.Lock()

    def probe(self, urls: list[str]) -> None:
        """Ask each index once, briefly: any HTTP answer below 500 counts (some indexes refuse HEAD).
        An index asked before is not asked again (preflight asks for every worker of a run)."""
        for url in dict.fromkeys(url for url in urls if url not in self._probed):
            if urlsplit(url).scheme not in ("http", "https"):
                raise FleetError(f"profile check: index {url}: only http and https indexes can be checked")
            self._probed.add(url)
            try:
                status = self.session.head(url, timeout=PROBE_TIMEOUT, allow_redirects=True).status_code
            except requests.Timeout:
                self.unanswered[url] = f"no answer within {PROBE_TIMEOUT:g} s"
            except requests.RequestException as exc:
                unresolved = "NameResolution" in str(exc) or "Name or service not known" in str(exc)
                self.unanswered[url] = (f"{urlsplit(url).hostname} does not resolve" if unresolved
                                        else "could not connect")
            else:
                if status >= 500:
                    self.unanswered[url] = f"HTTP {status}"

    def files(self, index: str, name: str) -> list[IndexFile]:
        """The files the index lists for a project (PEP 691 JSON, else PEP 503 HTML); none for a project it lacks."""
        key = (index, canonicalize_name(name))
        with self._lock:
            if key in self._pages:
                return self._pages[key]
        url = f"{index.rstrip('/')}/{key[1]}/"
        try:
            answer = self.session.get(url, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"},
                                      timeout=PAGE_TIMEOUT)
        except requests.RequestException as exc:
            raise FleetError(f"profile check: {url}: {type(exc).__name__}; the index answered the probe but not "
                             "this page: check again") from None
        files: list[IndexFile] = []
        if answer.status_code != 404:
            answer.raise_for_status()
            if answer.headers.get("content-type", "").startswith(SIMPLE_JSON):
                files = [IndexFile(f["filename"], urljoin(answer.url, f["url"]), f.get("requires-python"),
                                   bool(f.get("core-metadata") or f.get("data-dist-info-metadata")))
                         for f in answer.json()["files"]]
            else:
                parser = _AnchorParser(answer.url)
                parser.feed(answer.text)
                files = parser.files
        with self._lock:
            self._pages[key] = files
        return files

    def fetch(self, file: IndexFile) -> bytes:
        return self.fetch_url(file.url)

    def fetch_url(self, url: str) -> bytes:
        answer = self.session.get(url, timeout=PAGE_TIMEOUT)
        answer.raise_for_status()
        return answer.content


@dataclass
class Problem:
    """One reason a step does not install; kind: index, missing, no-wheel, python, conflict, elsewhere or pip."""

    kind: str
    message: str


@dataclass
class Standin:
    """A metadata-only wheel that takes a package's place in the resolver: one the profile says comes from
    an index not asked, or that the node builds from source."""

    name: str
    version: str
    requires: list[str] = field(default_factory=list)
    role: str = "not checked"  # what the summary says of it

    def write(self, directory: Path) -> None:
        stem = f"{canonicalize_name(self.name).replace('-', '_')}-{self.version}"
        metadata = "".join([f"Metadata-Version: 2.1\nName: {self.name}\nVersion: {self.version}\n",
                            *(f"Requires-Dist: {r}\n" for r in self.requires)])
        with zipfile.ZipFile(directory / f"{stem}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{stem}.dist-info/METADATA", metadata)
            wheel.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            wheel.writestr(f"{stem}.dist-info/RECORD", "")


@dataclass
class Finding:
    """What one failed pip run means: a problem, a note, and the stand-in that lets the resolver go on."""

    problem: Problem | None = None
    note: str | None = None
    standin: Standin | None = None


@dataclass
class StepResult:
    """One install step on one platform."""

    number: int
    requirements: list[str]
    indexes: list[str]
    resolved: bool = False
    installs: dict[str, str] = field(default_factory=dict)
    standins: dict[str, Standin] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        more = f" and {len(self.requirements) - 4} more" if len(self.requirements) > 4 else ""
        what = f"step {self.number} ({' '.join(self.requirements[:4])}{more})"
        if not self.resolved:
            return f"{what}: not resolved"
        unchecked = "".join(f", {s.name} {s.version} {s.role}" for s in self.standins.values())
        return f"{what}: {len(self.installs)} packages{unchecked}"


@dataclass
class OtherStep:
    """A step pip's resolver does not run: an uninstall, or a build over a pin (which the check finds at its
    source, with its sha256, for one platform)."""

    number: int
    what: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # none: pip does not run it

    def summary(self) -> str:
        return f"step {self.number} ({self.what})"


@dataclass
class PlatformResult:
    platform: Platform
    steps: list[StepResult | OtherStep]
    refused: str | None = None

    @property
    def problems(self) -> list[Problem]:
        refused = [Problem("refused", self.refused)] if self.refused else []
        return refused + [problem for step in self.steps for problem in step.problems]


@dataclass
class Check:
    """A profile check: the indexes that did not answer and each platform's steps."""

    profile: str
    index_url: str
    unanswered: dict[str, str]
    index_steps: dict[str, list[int]]
    platforms: list[PlatformResult]

    @property
    def problem_count(self) -> int:
        return len(self.unanswered) + sum(len(p.problems) for p in self.platforms)

    def lines(self) -> list[str]:
        """One line per problem, note and platform, as `profile check` prints them."""
        lines = [f"{self.profile} {steps_named(self.index_steps[url])}: index {url} did not answer ({why}); "
                 "checked without it" for url, why in self.unanswered.items()]
        for result in self.platforms:
            where = f"{self.profile} {result.platform}"
            lines += [f"{where}: {result.refused}"] if result.refused else []
            for step in result.steps:
                lines += [f"{where} step {step.number}: {problem.message}" for problem in step.problems]
                lines += [f"{where} step {step.number}: note: {note}" for note in step.notes]
            count = len(result.problems)
            verdict = f"{count} problem{'s' if count > 1 else ''}" if count else "resolves"
            lines.append(f"{where}: {verdict}: {'; '.join(step.summary() for step in result.steps)}")
        return lines

    def as_dict(self) -> dict:
        return {"profile": self.profile, "index_url": self.index_url, "unanswered_indexes": self.unanswered,
                "problems": self.problem_count, "lines": self.lines(),
                "platforms": [{"arch": r.platform.arch, "python": r.platform.python, "glibc": r.platform.glibc,
                               "refused": r.refused,
                               "steps": [step_dict(s) for s in r.steps]}
                              for r in self.platforms]}


def step_dict(step: StepResult | OtherStep) -> dict:
    problems = [{"kind": p.kind, "message": p.message} for p in step.problems]
    if isinstance(step, OtherStep):
        return {"step": step.number, "what": step.what, "problems": problems}
    return {"step": step.number, "requirements": step.requirements, "indexes": step.indexes,
            "resolved": step.resolved, "installs": step.installs,
            "standins": {n: {"version": w.version, "role": w.role} for n, w in step.standins.items()},
            "notes": step.notes, "problems": problems}


def other_steps(profile: Profile, platform: Platform, index_url: str, indexes: Indexes) -> list[OtherStep]:
    """The profile's uninstalls and builds over a pin as they apply to one platform: each build with its file,
    source and sha256, and what keeps a deploy from installing it (no build for the platform, tags it does
    not take, a sha256 not known, a source that does not answer here or does not list it)."""
    steps = []
    for number, step in enumerate(profile.pip.install, 1):
        if isinstance(step, RemoveStep):
            where = "" if set(step.arch) == set(ARCHES) else f" on {', '.join(step.arch)}"
            runs = "" if platform.arch in step.arch else f", not on {platform.arch}"
            steps.append(OtherStep(number, f"uninstall {' '.join(step.remove)}{where}{runs}"))
        elif isinstance(step, OverrideStep):
            steps.append(build_step(number, step, platform, index_url, indexes))
    return steps


def build_step(number: int, step: OverrideStep, platform: Platform, index_url: str, indexes: Indexes) -> OtherStep:
    build = step.build_for(platform.arch, platform.python)
    if build is None:
        return OtherStep(number, f"{step.override} build over its pin", [Problem(
            "no-wheel", f"{step.override}: no build for {platform} among {', '.join(b.file for b in step.builds)}")])
    _, version, _, tags = parse_wheel_filename(build.file)
    source = index_url if step.source == "index" else step.source
    result = OtherStep(number, f"{step.override} {version} over its pin, from {urlsplit(source).hostname}")
    said = [f"{step.override} {version} over its pin: {build.file} from {source}"]
    if not tags & platform.tags:
        said.append(f"its tags do not fit {platform}")
    if build.sha256 is None:
        said.append(f"sha256 unknown ({build.unknown}): a deploy refuses it until it is filled in")
    indexes.probe([source])
    if source in indexes.unanswered:
        said.append(f"not checked: {source} did not answer ({indexes.unanswered[source]})")
    elif step.source == "index" and build.file not in {f.filename for f in indexes.files(source, step.override)}:
        said.append(f"{source} does not list it")
    message = "; ".join(said)
    if len(said) > 1:
        result.problems.append(Problem("build", message))
    else:
        result.what += f", sha256 {build.sha256[:12]}…"
    return result


def steps_named(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"step {numbers[0]}"
    return f"steps {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def resolver_pip(indexes: Indexes, index_url: str, directory: Path) -> Path:
    """The pinned pip wheel, fetched from the index and checked against its sha256 (pip runs from its wheel)."""
    version, sha256 = RESOLVER_PIP
    name = f"pip-{version}-py3-none-any.whl"
    listed = [f for f in indexes.files(index_url, "pip") if f.filename == name]
    content = indexes.fetch(listed[0]) if listed else b""
    if hashlib.sha256(content).hexdigest() != sha256:
        raise FleetError(f"profile check: {index_url} has no {name} with sha256 {sha256} (the resolver the check "
                         "runs); give an --index-url that has it, such as https://pypi.org/simple")
    wheel = directory / name
    wheel.write_bytes(content)
    return wheel


class StepResolver:
    """Resolves the steps of one profile with pip, explaining each failure from the indexes' pages."""

    def __init__(self, profile: Profile, indexes: Indexes, pip_wheel: Path) -> None:
        self.profile, self.indexes, self.pip_wheel = profile, indexes, pip_wheel
        self.sources = {canonicalize_name(name): url for name, url in profile.pip.sources.items()}
        self.source_builds = {canonicalize_name(name) for name in profile.pip.source_builds}

    def resolve(self, platform: Platform, number: int, step: PipStep, index_url: str) -> StepResult:
        asked = [url for url in dict.fromkeys([index_url, *step.extra_index_urls])
                 if url not in self.indexes.unanswered]
        result = StepResult(number, step.requirements, asked)
        if not asked:
            result.problems.append(Problem("index", "no index of the step answered: not checked"))
            return result
        with tempfile.TemporaryDirectory(prefix="ascend-fleet-check-") as scratch:
            standins = Path(scratch) / "standins"
            standins.mkdir()
            report = Path(scratch) / "report.json"
            while True:
                run = self.run_pip(platform, asked, standins, step.requirements, report)
                if run.returncode == 0:
                    installs = json.loads(report.read_text())["install"]
                    result.installs = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                                       for i in installs}
                    result.resolved = True
                    return result
                output = run.stdout + run.stderr
                finding = self.explain(output, platform, number, asked)
                if finding.standin and canonicalize_name(finding.standin.name) in result.standins:
                    finding = Finding(Problem("pip", pip_error(output)))  # the stand-in did not help
                if finding.problem:
                    result.problems.append(finding.problem)
                if finding.note:
                    result.notes.append(finding.note)
                if finding.standin is None:
                    return result
                finding.standin.write(standins)
                result.standins[canonicalize_name(finding.standin.name)] = finding.standin

    def run_pip(self, platform: Platform, asked: list[str], standins: Path, requirements: list[str],
                report: Path) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-c", PIP_BOOTSTRAP, str(self.pip_wheel), json.dumps(platform.markers()),
                "--isolated", "install", "--dry-run", "--ignore-installed",
                "--report", str(report), *platform.pip_options(), "--use-feature=fast-deps",
                *shlex.split(index_options(asked[0], asked[1:])), "--find-links", str(standins), *requirements]
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=pip_environment(dict(os.environ)),
                                  timeout=PIP_TIMEOUT)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 1, "", f"ERROR: pip did not finish within {PIP_TIMEOUT} s")

    def explain(self, output: str, platform: Platform, step: int, asked: list[str]) -> Finding:
        """What pip's failure means, from its message and the indexes' pages."""
        found = NOT_FOUND.search(output)
        requirement = parse_requirement(found["requirement"]) if found else None
        if requirement:
            finding = self.unavailable(requirement, found["parent"], platform, asked)
            if finding:
                return finding
        conflict = conflict_lines(output)
        if conflict:
            # A side of the conflict that no index checked offers: the profile may say where it comes from.
            unavailable = [f for f in (self.unavailable(r, parent, platform, asked) for parent, r in conflict) if f]
            for finding in unavailable:
                if finding.problem and finding.problem.kind == "elsewhere" and finding.standin:
                    return finding
            causes = [f"{parent} depends on {r}" if parent else f"step {step} asks for {r}" for parent, r in conflict]
            causes += [f.problem.message for f in unavailable if f.problem]
            return Finding(Problem("conflict", f"conflict: {'; '.join(causes)}"))
        return Finding(Problem("pip", pip_error(output)))

    def unavailable(self, requirement: Requirement, parent: str | None, platform: Platform,
                    asked: list[str]) -> Finding | None:
        """Why no file of the asked indexes satisfies the requirement on this platform; None when one does."""
        name = canonicalize_name(requirement.name)
        wanted = f"{requirement}{f' (required by {parent})' if parent else ''}"
        files = [f for index in asked for f in self.indexes.files(index, name) if f.version is not None]
        matching = [f for f in files if requirement.specifier.contains(f.version, prereleases=True)]
        source = self.sources.get(name)
        if not matching:
            if source and source not in asked:
                why = "did not answer" if source in self.indexes.unanswered else "is not among the indexes checked"
                return Finding(Problem("elsewhere", f"{wanted} is not on {', '.join(asked)}; the profile takes it "
                                                    f"from {source} (pip.sources), which {why}"),
                               standin=pinned_standin(requirement))
            there = versions_there(name, files, requirement)
            return Finding(Problem("missing", f"{wanted}: no index checked has it; {there}"))
        for_python = [f for f in matching if python_accepts(f.requires_python, platform.python)]
        if not for_python:
            needs = sorted({f.requires_python for f in matching if f.requires_python})
            return Finding(Problem("python", f"{wanted} needs Python {' or '.join(needs)}, not {platform.python}"))
        wheels = [f for f in for_python if f.wheel]
        if any(f.wheel[1] & platform.tags for f in wheels):
            return None
        sdist = max((f for f in for_python if not f.wheel), key=lambda f: f.version, default=None)
        if sdist and name in self.source_builds:
            standin, caveat = self.sdist_standin(requirement, sdist)
            return Finding(note=f"{wanted} has no wheel for {platform}: pip builds {sdist.filename} on the node "
                                f"(pip.source_builds){caveat}", standin=standin)
        have = [describe_wheels(wheels, platform.arch)] if wheels else []
        if sdist:
            have.append(f"pip would build its source {sdist.filename} on the node (list it under "
                        "pip.source_builds if that is meant)")
        return Finding(Problem("no-wheel", f"{wanted} has no wheel for {platform}: {'; '.join(have)}"))

    def sdist_standin(self, requirement: Requirement, sdist: IndexFile) -> tuple[Standin, str]:
        """A stand-in with the Requires-Dist of the sdist's PKG-INFO, and what to say of them: only metadata
        2.2 and later that does not call them Dynamic fixes them (PEP 643)."""
        info = sdist_metadata(self.indexes.fetch(sdist))
        requires = info.get_all("Requires-Dist", []) if info else []
        fixed = (info is not None and Version(info.get("Metadata-Version", "1.0")) >= Version("2.2")
                 and "requires-dist" not in {d.lower() for d in info.get_all("Dynamic", [])})
        caveat = "" if fixed else ("; its dependencies as its PKG-INFO lists them, which the build may change"
                                   if requires else "; its dependencies are not known before it is built")
        return Standin(requirement.name, str(sdist.version), requires, "built on the node"), caveat


def sdist_metadata(content: bytes) -> email.message.Message | None:
    """The PKG-INFO at the top of a .tar.gz source distribution, if it has one."""
    try:
        with tarfile.open(fileobj=io.BytesIO(content)) as archive:
            member = next((m for m in archive.getmembers()
                           if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None)
            return email.parser.Parser().parsestr(archive.extractfile(member).read().decode()) if member else None
    except tarfile.TarError:
        return None


def parse_requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def pip_error(output: str) -> str:
    """pip's last ERROR line: what it says went wrong when the check cannot say more."""
    errors = [line.removeprefix("ERROR: ") for line in output.splitlines() if line.startswith("ERROR: ")]
    return f"pip: {errors[-1] if errors else 'failed without a message'}"


def pinned_standin(requirement: Requirement) -> Standin | None:
    """A stand-in at the one version an `==V` requirement names; none for a range (no version to stand in)."""
    specs = list(requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return Standin(requirement.name, specs[0].version)
    return None


def conflict_lines(output: str) -> list[tuple[str | None, Requirement]]:
    """pip's "The conflict is caused by:" lines as (who, requirement); who is None for the step's own."""
    block = output.split("The conflict is caused by:\n", 1)
    if len(block) < 2:
        return []
    causes = []
    for line in block[1].split("\n\n", 1)[0].splitlines():
        found = CONFLICT_LINE.match(line.strip())
        # pip joins a specifier's parts with " and "
        requirement = parse_requirement(found["requirement"].replace(" and ", ",")) if found else None
        if requirement:
            causes.append((found["parent"], requirement))
    return causes


def python_accepts(requires_python: str | None, python: str) -> bool:
    try:
        return not requires_python or SpecifierSet(requires_python).contains(python, prereleases=True)
    except ValueError:  # pip ignores a malformed Requires-Python too
        return True


def versions_there(name: str, files: list[IndexFile], requirement: Requirement) -> str:
    """The versions the indexes have, those of the pin's own release series first."""
    versions = sorted({f.version for f in files}, reverse=True)
    if not versions:
        return f"no index checked has a project {name}"
    pins = [Version(s.version) for s in requirement.specifier if s.operator == "==" and "*" not in s.version]
    near = [v for v in versions if pins and v.release[:2] == pins[0].release[:2]] or versions
    shown = ", ".join(str(v) for v in sorted(near[:NEAR_VERSIONS]))
    return f"{'versions' if len(near) <= NEAR_VERSIONS else 'newest versions'} there: {shown}"


def describe_wheels(wheels: list[IndexFile], arch: str) -> str:
    """The platforms the wheels are for, each with its interpreters; those of the node's arch if there are any."""
    by_platforms: dict[str, set[str]] = {}
    for wheel in wheels:
        tags = [tag for tag in wheel.wheel[1] if arch in tag.platform] or list(wheel.wheel[1])
        platforms = ", ".join(sorted({tag.platform for tag in tags}))
        pythons = {t.interpreter if t.abi == t.interpreter else f"{t.interpreter}-{t.abi}" for t in tags}
        by_platforms.setdefault(platforms, set()).update(pythons)
    on_arch = {k: v for k, v in by_platforms.items() if arch in k} or by_platforms
    return "its wheels are for " + "; ".join(f"{k} ({', '.join(sorted(v))})" for k, v in sorted(on_arch.items()))


def check_profile(profile: Profile, platforms: list[Platform], index_urls: list[str] | None = None,
                  progress: Callable[[str], None] = lambda line: None, indexes: Indexes | None = None) -> Check:
    """Resolve every install step of the profile on every platform; index_urls replace the profile's indexes;
    indexes: the pages read so far (`profile check` reads them once for the steps and the end state)."""
    steps = profile.install_steps()
    positions = [n for n, step in enumerate(profile.pip.install, 1) if isinstance(step, InstallStep)]
    if index_urls:
        index_url = index_urls[0]
        steps = [PipStep(step.requirements, index_urls[1:]) for step in steps]
    elif profile.pip.index_url:
        index_url = profile.pip.index_url
    else:
        raise FleetError(f"profile check: profile {profile.name} has pip.index_url null (host data decides): "
                         "pass --index-url")
    index_steps: dict[str, list[int]] = {}
    for number, step in zip(positions, steps):
        for url in dict.fromkeys([index_url, *step.extra_index_urls]):
            index_steps.setdefault(url, []).append(number)
    indexes = indexes or Indexes()
    indexes.probe(list(index_steps))
    answering = [url for url in index_steps if url not in indexes.unanswered]
    if not answering:
        raise FleetError(f"profile check: no index answered ({', '.join(index_steps)}); check the network or "
                         "give --index-url")
    jobs = [(platform, number, step) for platform in platforms for number, step in zip(positions, steps)]
    progress(f"profile check {profile.name}: {len(jobs)} pip resolutions with pip {RESOLVER_PIP[0]} "
             f"({', '.join(map(str, platforms))}), about a minute each")
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-pip-") as scratch:
        resolver = StepResolver(profile, indexes, resolver_pip(indexes, answering[0], Path(scratch)))
        with ThreadPoolExecutor(WORKERS) as pool:
            done = list(pool.map(lambda job: resolver.resolve(*job, index_url), jobs))
    results = []
    for platform in platforms:
        resolved = [r for (p, _, _), r in zip(jobs, done) if p == platform]
        ordered = sorted([*resolved, *other_steps(profile, platform, index_url, indexes)], key=lambda s: s.number)
        results.append(PlatformResult(platform, ordered, profile.refusal(platform.arch)))
    unanswered = {url: why for url, why in indexes.unanswered.items() if url in index_steps}  # builds' say theirs
    return Check(profile.name, index_url, unanswered, index_steps, results)
