"""`ascend-fleet bundle`: what an inventory's workers install, in one folder to carry into a site with no
internet, and `ascend-fleet bundle verify`: every file of it against its manifest.

Made on a machine that reaches the indexes. For each profile the workers run and each arch asked for:

- `locks/`: the profile's lock for the arch and its Python (the site's own from `pip_locks_dir`, else the
  committed one, else made here with `profile lock`), which the nodes install from;
- `packages/` and `simple/`: every file of those locks, downloaded for the nodes' platform and checked
  against the lock's sha256 by pip, and the builds over pins (checked against the profile's sha256), as a
  PEP 503 index (package_index.py): the site serves it, pip on the nodes reads it;
- `files/`: the vendor .run files of the stack (files/ here, else the host data's `vendor_mirror_url`),
  each checked against the profile's sha256;
- `models/<org>/<name>/<revision>/`: each model the workers serve with the manifest the weights stager
  reads (model_tree.py): from its http mirror, checked against that manifest, or from `--model-dir` for
  weights already on disk (a hub cannot be reached from where a bundle is made for an offline site);
- the gateways' vllm-router, where one routes cache_aware (docs/vllm-router.md): the lock of the release its
  profile pins for each arch and for the gateways' system Python (each `--os` release's, else the profile's),
  in `locks/`, and its files in `packages/` (the site's index serves them with the stack's);
- `bundle-manifest.json`: every file above with its sha256, and the platforms the bundle serves.

- `os/<release>-<arch>/`: for each release `--os` names, the OS packages every stage installs, with their
  dependencies, as a repository the nodes' apt or dnf reads (os_repository.py);
- `control/`: the control machine's own install, ascend-fleet (a wheel of this checkout) and its
  dependencies for this machine's platform: `pip install --no-index --find-links control/ ascend-fleet`
  on a control machine inside the site;

A rerun downloads only what is missing.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel

from ascend_fleet import FILES, PROJECT_ROOT
from ascend_fleet.config.hostdata import URL, Model, NodeConfig
from ascend_fleet.config.node_os import NodeOs
from ascend_fleet.config.per_run import profile_of_the_run
from ascend_fleet.config.profile import PipBuild, Profile, Router
from ascend_fleet.core.bundle_layout import (
    CONTROL_DIR,
    LOCKS_DIR,
    MANIFEST,
    MODELS_DIR,
    OS_DIR,
    VENDOR_DIR,
    read_bundle_manifest,
)
from ascend_fleet.core.errors import FleetError, InputError, describe_unreadable
from ascend_fleet.core.model_tree import read_manifest, weights_manifest, write_manifest
from ascend_fleet.core.node_layout import MANIFEST_NAME
from ascend_fleet.core.package_index import PACKAGES_DIR, SIMPLE_DIR, file_sha256, write_simple_index
from ascend_fleet.fleet.os_repository import (
    DEFAULT_ARCHIVES,
    MIRROR_GROUP,
    build_apt_repository,
    build_dnf_repository,
    fleet_packages,
    kernel_headers_packages,
    kernel_releases,
    repository_name,
    served_release,
)
from ascend_fleet.fleet.plan import fleet_node_configs, load_inventory
from ascend_fleet.fleet.profile_check import DEFAULT_GLIBC, Indexes, Platform, pip_environment
from ascend_fleet.fleet.profile_lock import (
    ROUTER_GLIBC,
    lock_path,
    lock_profile,
    lock_router,
    node_lock,
    router_lock,
    router_lock_path,
)

# An archive the package manager reads: http(s) as host data's URLs allow it (no blank, quote, $ or `: dnf
# expands $ in a baseurl), or a folder here (file://).
ARCHIVE_URL = re.compile("(?:https?|file)" + URL.pattern.removeprefix("https?"))
DOWNLOAD_TIMEOUT = 3600  # seconds for one pip download of a lock's files (GBs for a vLLM stack)


@dataclass(frozen=True)
class Target:
    """One platform the bundle serves: a profile's stack for one arch and Python."""

    profile: Profile
    arch: str
    config: NodeConfig  # a worker of this profile: its data names the site's locks and vendor mirror

    @property
    def platform(self) -> Platform:
        return Platform(self.arch, self.profile.stack.python, DEFAULT_GLIBC)

    def __str__(self) -> str:
        return f"{self.profile.name} {self.arch} Python {self.profile.stack.python}"


def worker_configs(configs: list[NodeConfig], inventory: Path) -> list[NodeConfig]:
    workers = [config for config in configs if config.is_worker]
    if not workers:
        raise FleetError(f"bundle: {inventory} has no worker (a host with npu_count): nothing to bundle")
    return workers


def targets(scope: object, workers: list[NodeConfig], arches: list[str] | None) -> list[Target]:
    """Each profile the workers run (read once for the scope: per_run.profile_of_the_run), on each arch asked
    for (default: every arch it lists)."""
    found: dict[str, Target] = {}
    for config in workers:
        profile = profile_of_the_run(scope, config.profile)
        for arch in arches or profile.arch:
            if arch not in profile.arch:
                raise FleetError(f"bundle: --arch {arch}: profile {profile.name} lists {', '.join(profile.arch)}")
            found.setdefault(f"{profile.name} {arch}", Target(profile, arch, config))
    return list(found.values())


def build_bundle(inventory: Path, out: Path, arches: list[str] | None = None,
                 progress: Callable[[str], None] = print, override_data: dict | None = None,
                 model_dirs: list[Path] = (), os_releases: list[str] = (), kernels: list[str] = ()) -> dict:
    """Make (or complete) the bundle in out; returns its manifest. override_data: as pyinfra's --data;
    model_dirs: weights already on disk (each with its ascend-fleet manifest, or the fleet's one model);
    os_releases: the releases the nodes run, "Debian 12" or "Debian 12=ARCHIVE_URL" (default: the
    distribution's own archive); kernels: the kernels the nodes run (`uname -r`), whose headers the driver
    builds against."""
    inventory_data = load_inventory(inventory, override_data=override_data)
    configs = fleet_node_configs(inventory_data)
    workers = worker_configs(configs, inventory)
    chosen = targets(inventory_data, workers, arches)
    releases = [(served_release(name.strip()), archive.strip() or None)
                for name, _, archive in (release.partition("=") for release in os_releases)]
    kernels = kernel_releases(list(kernels))
    for sub in (LOCKS_DIR, PACKAGES_DIR, VENDOR_DIR, MODELS_DIR, CONTROL_DIR):
        (out / sub).mkdir(parents=True, exist_ok=True)
    bundle_control_install(out / CONTROL_DIR, progress)
    platforms = []
    for target in chosen:
        lock = bundle_lock(target, out, progress)
        download_locked(target, out / LOCKS_DIR / lock, progress)
        for build in builds_over_pins(target):
            fetch_build(target, build, out / PACKAGES_DIR, progress)
        copy_vendor_files(target, out / VENDOR_DIR, progress)
        platforms.append({"profile": target.profile.name, "arch": target.arch,
                          "python": target.profile.stack.python, "lock": f"{LOCKS_DIR}/{lock}"})
    routers = bundle_routers(inventory_data, configs, arches, [known for known, _ in releases], out, progress)
    bundle_models(workers, model_dirs, out / MODELS_DIR, progress)
    write_simple_index(out)
    mirror_hosts = bool(inventory_data.groups.get(MIRROR_GROUP))
    repositories = [bundle_os(inventory_data, known, arch, configs, mirror_hosts, archive, kernels, out, progress)
                    for known, archive in releases for arch in dict.fromkeys(target.arch for target in chosen)]
    progress("hashing every file for the manifest")
    manifest = {"platforms": platforms, "routers": routers, "os": repositories, "files": current_files(out)}
    partial = out / f".{MANIFEST}.{os.getpid()}"
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(partial, out / MANIFEST)
    size = sum((out / name).stat().st_size for name in manifest["files"])
    progress(f"{out}: {len(manifest['files'])} files, {size / 1e6:.1f} MB, for {', '.join(map(str, chosen))}")
    return manifest


def bundle_os(scope: object, known: NodeOs, arch: str, configs: list[NodeConfig], mirror_hosts: bool,
              archive: str | None, kernels: list[str], out: Path, progress: Callable[[str], None]) -> dict:
    """The release's OS packages for every role of the fleet, on arch, and the headers of the kernels the nodes
    run, as out/os/<release>-<arch>/, from archive (default: the distribution's own); the profiles read once
    for the scope."""
    archive = (archive or DEFAULT_ARCHIVES.get(known.distribution, "")).format(release=known.release).rstrip("/")
    if not ARCHIVE_URL.fullmatch(archive):
        raise FleetError(f"bundle: --os '{known.name}': archive {archive!r} is not an http(s) or file URL without "
                         "blanks, quotes, $ or `; give the release's archive after the =")
    name = repository_name(known, arch)
    build = build_apt_repository if known.package_manager == "apt" else build_dnf_repository
    packages = fleet_packages(scope, known, configs, mirror_hosts) + kernel_headers_packages(known, arch, kernels)
    build(out / OS_DIR / name, known, arch, archive, packages, progress)
    return {"distribution": known.distribution, "release": known.release, "arch": arch,
            "repository": f"{OS_DIR}/{name}", "packages": packages}


def bundle_lock(target: Target, out: Path, progress: Callable[[str], None]) -> str:
    """The target's lock into out/locks/: the site's or the committed one, else made now."""
    name = lock_path(target.profile.name, target.platform).name
    found = node_lock(target.profile, target.arch, target.profile.stack.python, target.config.pip_locks_path)
    if found is None:
        progress(f"{target}: no lock yet, locking it (`ascend-fleet profile lock`)")
        made = lock_profile(target.profile, target.platform, index_urls(target), progress)
        text = made.text
    else:
        text = found.text
    (out / LOCKS_DIR / name).write_text(text)
    return name


def bundle_control_install(control: Path, progress: Callable[[str], None]) -> None:
    """ascend-fleet, built from this checkout, and the wheels of its dependencies (no extra: `tune`'s chart is
    optional) for this machine's platform, into control/."""
    if not (PROJECT_ROOT / "pyproject.toml").exists():
        raise FleetError(f"bundle: {PROJECT_ROOT} is not an ascend-fleet checkout: the control machine's install "
                         "is built from one")
    progress("the control machine's install: ascend-fleet and its dependencies")
    requirements = [line for line in importlib.metadata.requires("ascend-fleet") or [] if "extra ==" not in line]
    for command, *arguments in (["wheel", "--no-deps", "--wheel-dir", str(control), str(PROJECT_ROOT)],
                                ["download", "--only-binary", ":all:", "--dest", str(control), *requirements]):
        result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", command,
                                 *arguments], capture_output=True, text=True, env=pip_environment(dict(os.environ)),
                                timeout=DOWNLOAD_TIMEOUT)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
            raise FleetError(f"bundle: the control machine's install: `pip {command}` failed: "
                             f"{(errors or [result.stderr[-300:]])[0]}")


def index_urls(target: Target) -> list[str]:
    main = target.profile.pip.index_url or target.config.pip_index_url
    if not main:
        raise FleetError(f"bundle: profile {target.profile.name} names no index and its workers' data has no "
                         "pip_index_url")
    return [main, *target.profile.pip.extra_index_urls]


def download_locked(target: Target, lock: Path, progress: Callable[[str], None]) -> None:
    """Every file of the lock for the target's platform into packages/, each checked by pip against the
    lock's sha256 (files already there are not fetched again)."""
    progress(f"{target}: downloading the files of {lock.name}")
    download_lock_files(str(target), lock, target.platform, index_urls(target))


def download_lock_files(what: str, lock: Path, platform: Platform, urls: list[str]) -> None:
    """Every file of the lock for platform from the indexes into the bundle's packages/ (beside locks/)."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--require-hashes", "-r", str(lock), "--dest", str(lock.parent.parent / PACKAGES_DIR),
            "--implementation", "cp", "--python-version", platform.python, "--abi", platform.abi,
            *(f"--platform={tag}" for tag in platform.platform_tags), "--index-url", urls[0],
            *(option for url in urls[1:] for option in ("--extra-index-url", url)),
            # pip ignores a plain-http index (a site's or the lab's mirror) unless its host is trusted.
            *(option for url in urls if url.startswith("http://")
              for option in ("--trusted-host", urlsplit(url).hostname or url))]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=pip_environment(dict(os.environ)),
                                timeout=DOWNLOAD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise FleetError(f"bundle: {what}: pip download of {lock.name} took over {DOWNLOAD_TIMEOUT} s") from None
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")] or [result.stderr[-300:]]
        raise FleetError(f"bundle: {what}: pip download of {lock.name} failed: {errors[0]}")


def bundle_routers(scope: object, configs: list[NodeConfig], arches: list[str] | None, releases: list[NodeOs],
                   out: Path, progress: Callable[[str], None]) -> list[dict]:
    """The vllm-router of each gateway that routes cache_aware: its lock (the site's or the committed one,
    else made now) for each arch and each of the gateways' Pythons, into locks/, and its files into
    packages/. One entry per lock, for the manifest. The profiles read once for the scope."""
    found: dict[tuple[str, str, str], dict] = {}
    for config in configs:
        if not config.is_gateway or config.gateway.routing.policy != "cache_aware":
            continue
        profile = profile_of_the_run(scope, config.profile)
        if profile.router is None:
            raise FleetError(f"bundle: {config.host} routes cache_aware, but profile {profile.name} pins no "
                             "vllm-router")
        pythons = sorted({known.system_python for known in releases} or {profile.stack.python})
        for arch in arches or profile.arch:
            for python in pythons:
                key = (profile.router.vllm_router, arch, python)
                if key not in found:
                    found[key] = bundle_router(profile, profile.router, config, Platform(arch, python, ROUTER_GLIBC),
                                               out, progress)
    return list(found.values())


def bundle_router(profile: Profile, router: Router, config: NodeConfig, platform: Platform, out: Path,
                  progress: Callable[[str], None]) -> dict:
    """One lock of the router into locks/ and its files into packages/, from the profile's index (else the
    gateway's); its manifest entry."""
    what = f"{router.requirement} {platform}"
    urls = [profile.pip.index_url or config.pip_index_url]
    if not urls[0]:
        raise FleetError(f"bundle: profile {profile.name} names no index and {config.host}'s data has no "
                         "pip_index_url")
    lock = out / LOCKS_DIR / router_lock_path(router, platform).name
    found = router_lock(router, platform.arch, platform.python, config.pip_locks_path)
    if found is None:
        progress(f"{what}: no lock yet, locking it (`ascend-fleet profile lock --router`)")
    lock.write_text(found.text if found else lock_router(router, platform, urls, progress))
    progress(f"{what}: downloading the files of {lock.name}")
    download_lock_files(what, lock, platform, urls)
    return {"vllm_router": router.vllm_router, "arch": platform.arch, "python": platform.python,
            "lock": f"{LOCKS_DIR}/{lock.name}"}


def builds_over_pins(target: Target) -> list[PipBuild]:
    """The builds the target's nodes install over pins (refused without a sha256, as a deploy refuses them)."""
    steps = target.profile.node_steps(target.arch, lock=node_lock(target.profile, target.arch,
                                                                  target.profile.stack.python,
                                                                  target.config.pip_locks_path))
    return [step for step in steps if isinstance(step, PipBuild)]


def fetch_build(target: Target, build: PipBuild, packages: Path, progress: Callable[[str], None]) -> None:
    """A build over a pin into packages/, from its URL or its index, checked against the profile's sha256."""
    dest = packages / build.file
    if holds(dest, build.sha256):
        return
    if build.from_index:
        index = index_urls(target)[0]
        listed = next((f for f in Indexes().files(index, build.name) if f.filename == build.file), None)
        if listed is None:
            raise FleetError(f"bundle: {target}: {index} does not list {build.file}")
        url = listed.url
    else:
        url = build.url
    progress(f"{target}: fetching {build.file}")
    download(url, dest, build.sha256)


def holds(path: Path, sha256: str) -> bool:
    """The bundle has this file as it should be (a rerun fetches and copies nothing it holds)."""
    return path.exists() and file_sha256(path) == sha256


def download(url: str, dest: Path, sha256: str) -> None:
    """url into dest, checked against sha256 before it takes dest's name."""
    with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=f".{dest.name}.", delete=False) as partial:
        try:
            with requests.get(url.split("#", 1)[0], stream=True, timeout=60) as answer:
                answer.raise_for_status()
                for block in answer.iter_content(1 << 20):
                    partial.write(block)
            partial.close()
            if file_sha256(Path(partial.name)) != sha256:
                raise FleetError(f"bundle: {url} is not the file its profile pins (sha256 differs from {sha256})")
            os.replace(partial.name, dest)
        finally:
            Path(partial.name).unlink(missing_ok=True)


def copy_vendor_files(target: Target, files: Path, progress: Callable[[str], None]) -> None:
    """The stack's .run files into files/: from files/ here, else the workers' vendor_mirror_url; each must be
    what the profile pins."""
    for name in target.profile.vendor_files(target.arch).values():
        sha256 = target.profile.sha256_of(name)  # refuses a file without one, naming it
        dest = files / name
        if holds(dest, sha256):
            continue
        local = FILES / name
        if local.exists():
            if file_sha256(local) != sha256:
                raise FleetError(f"bundle: {local.absolute()} is not the {name} profile {target.profile.name} pins "
                                 f"(sha256 {sha256}); download it again")
            shutil.copyfile(local, dest)
            continue
        mirror = target.config.vendor_mirror_url
        if not mirror:
            raise FleetError(f"bundle: {target}: {local.absolute()} is missing and the workers' data names no "
                             "vendor_mirror_url; download it from Huawei into files/")
        progress(f"{target}: fetching {name}")
        download(f"{mirror.rstrip('/')}/{name}", dest, sha256)


def bundle_models(workers: list[NodeConfig], model_dirs: list[Path], models: Path,
                  progress: Callable[[str], None]) -> None:
    """Each model the workers serve into the models tree: from --model-dir, else from its http mirror."""
    wanted = {(config.model.id, config.model.revision): config.model for config in workers if config.model}
    on_disk = {}
    for directory in model_dirs:
        if (directory / MANIFEST_NAME).exists():
            manifest = given_weights_manifest(directory)
            on_disk[(manifest["model_id"], manifest["revision"])] = directory
        elif len(wanted) == 1:
            on_disk[next(iter(wanted))] = directory
        else:
            raise FleetError(f"bundle: --model-dir {directory} has no {MANIFEST_NAME} and the fleet serves "
                             f"{len(wanted)} models: say which with a manifest in it")
    for key, model in sorted(wanted.items()):
        target = models / key[0] / key[1]
        if key in on_disk:
            copy_model(on_disk[key], model, target, progress)
        elif model.source == "http":
            fetch_model(model, target, progress)
        else:
            raise FleetError(f"bundle: model {model.id}@{model.revision} comes from {model.source}, which a bundle "
                             "does not fetch: download it, then give --model-dir with its files")


class WeightsFile(BaseModel):
    sha256: str
    size: int


class WeightsManifest(BaseModel):
    """The weights stager's manifest (model_tree.weights_manifest) as a --model-dir carries it."""

    model_id: str
    revision: str
    files: dict[str, WeightsFile]


def given_weights_manifest(directory: Path) -> dict:
    """--model-dir's manifest, refused in one line naming it and the key when it is not of the shape the
    weights stager writes (a hand-made or truncated one)."""
    try:
        manifest = read_manifest(directory)
        WeightsManifest.model_validate(manifest)
    except (OSError, ValueError) as exc:  # ValidationError and JSONDecodeError are ValueErrors
        why = describe_unreadable(exc, WeightsManifest)
        raise InputError(f"bundle: --model-dir {directory}: cannot read {MANIFEST_NAME} ({why}); make it with the "
                         "weights' own files, or leave it out (the bundle makes one)") from None
    return manifest


def copy_model(directory: Path, model: Model, target: Path, progress: Callable[[str], None]) -> None:
    """Weights on disk into the tree, with their manifest (made here when they have none), checked."""
    given = (directory / MANIFEST_NAME).exists()
    manifest = given_weights_manifest(directory) if given else weights_manifest(directory, model.id, model.revision)
    progress(f"model {model.id}@{model.revision}: {len(manifest['files'])} files from {directory}")
    for name, entry in manifest["files"].items():
        dest = target / name
        if holds(dest, entry["sha256"]):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(directory / name, dest)
        if given and file_sha256(dest) != entry["sha256"]:
            raise FleetError(f"bundle: {directory / name} is not the file its {MANIFEST_NAME} lists (sha256)")
    write_manifest(target, manifest)


def fetch_model(model: Model, target: Path, progress: Callable[[str], None]) -> None:
    """A model from its http mirror: the manifest, then each file it lists, checked against it."""
    base = f"{model.url.rstrip('/')}/models/{model.id}/{model.revision}"
    answer = requests.get(f"{base}/{MANIFEST_NAME}", timeout=60)
    if answer.status_code != 200:
        raise FleetError(f"bundle: {base}/{MANIFEST_NAME} answered HTTP {answer.status_code}")
    manifest = answer.json()
    target.mkdir(parents=True, exist_ok=True)
    missing = {name: entry for name, entry in manifest["files"].items()
               if not holds(target / name, entry["sha256"])}
    progress(f"model {model.id}@{model.revision}: fetching {len(missing)} of {len(manifest['files'])} files")
    for name, entry in missing.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        download(f"{base}/{name}", target / name, entry["sha256"])
    write_manifest(target, manifest)


def current_files(out: Path) -> dict[str, str]:
    """Every file the bundle carries, by its path in the bundle, with its sha256."""
    return {path.relative_to(out).as_posix(): file_sha256(path)
            for sub in (LOCKS_DIR, PACKAGES_DIR, SIMPLE_DIR, VENDOR_DIR, MODELS_DIR, OS_DIR, CONTROL_DIR)
            for path in sorted((out / sub).rglob("*")) if path.is_file() and not path.name.startswith(".")}


def verify_bundle(out: Path) -> list[str]:
    """One line per file that is not as the manifest lists it: changed, missing, or not listed."""
    listed = read_bundle_manifest(out).files
    found = current_files(out)
    lines = [f"bundle {out}: {name} differs from the manifest (sha256 {found[name]}, listed {digest})"
             for name, digest in listed.items() if name in found and found[name] != digest]
    lines += [f"bundle {out}: {name} is missing" for name in listed if name not in found]
    lines += [f"bundle {out}: {name} is not in the manifest" for name in found if name not in listed]
    return lines


def os_coverage_refusal(out: Path, known: NodeOs, arch: str, needed: list[str] = ()) -> str | None:
    """Why the bundle has no OS packages for a node of this release and arch, or lacks one the node's stages
    install (needed: os_repository.fleet_packages of its roles; a second gateway's keepalived in a bundle made
    for one gateway), or None."""
    served = read_bundle_manifest(out).os
    entry = next((r for r in served if (r.distribution, r.release, r.arch) == (known.distribution, known.release,
                                                                                arch)), None)
    again = f"`ascend-fleet bundle INVENTORY --out {out} --os '{known.name}' --arch {arch}` where the archive answers"
    if entry is None:
        has = ", ".join(f"{r.distribution} {r.release} {r.arch}" for r in served) or "none"
        return f"bundle {out} has no OS packages for {known.name} {arch} (it has {has}); make it with {again}"
    lacking = [] if entry.packages is None else [name for name in needed if name not in entry.packages]
    if lacking:
        return (f"bundle {out}'s {known.name} {arch} packages lack {', '.join(lacking)}, which this host's stages "
                f"install (the bundle was made for another shape of the fleet); make it again from this inventory "
                f"with {again}")
    return None


def rpms_lacking(out: Path, known: NodeOs, arch: str, packages: list[str]) -> list[str]:
    """Which of these packages, each NAME-VERSION-RELEASE.ARCH, the bundle's dnf repository for this release and
    arch lacks: dnf download keeps the repository's file names, NAME-VERSION-RELEASE.ARCH.rpm (rpmbuild's
    default _rpmfilename, which openEuler's repositories keep)."""
    listed = read_bundle_manifest(out).files
    return [package for package in packages
            if f"{OS_DIR}/{repository_name(known, arch)}/{package}.rpm" not in listed]


def coverage_refusal(out: Path, profile: str, arch: str, python: str) -> str | None:
    """Why the bundle cannot serve a node of this profile, arch and Python, or None."""
    served = read_bundle_manifest(out).platforms
    if any((p.profile, p.arch, p.python) == (profile, arch, python) for p in served):
        return None
    has = ", ".join(f"{p.profile} {p.arch} Python {p.python}" for p in served) or "nothing"
    return (f"bundle {out} has no {profile} for {arch} Python {python} (it has {has}); make it with "
            f"`ascend-fleet bundle INVENTORY --out {out} --arch {arch}` where the indexes answer")


def router_coverage_refusal(out: Path, version: str, arch: str, python: str) -> str | None:
    """Why the bundle cannot install vllm-router `version` on a gateway of this arch and system Python, or None."""
    served = read_bundle_manifest(out).routers
    if any((r.vllm_router, r.arch, r.python) == (version, arch, python) for r in served):
        return None
    has = ", ".join(f"vllm-router {r.vllm_router} {r.arch} Python {r.python}" for r in served) or "none"
    return (f"bundle {out} has no vllm-router {version} for {arch} Python {python} (it has {has}); make it with "
            f"`ascend-fleet bundle INVENTORY --out {out} --arch {arch} --os RELEASE` where the indexes answer")
