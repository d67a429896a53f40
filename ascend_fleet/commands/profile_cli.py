"""`ascend-fleet profile check`: whether a profile's pip installs resolve on its nodes, before any node is touched."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ascend_fleet.config.profile import Profile, load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.profile_check import (
    DEFAULT_GLIBC,
    Indexes,
    Platform,
    check_profile,
    node_interpreter,
    platforms_to_check,
)
from ascend_fleet.fleet.profile_lock import (
    ROUTER_GLIBC,
    LockError,
    end_state_verdicts,
    lock_path,
    lock_profile,
    lock_router,
    lock_verdicts,
    router_lock_path,
)
from ascend_fleet.fleet.profile_new import (
    PROJECT,
    judge,
    newest_prerelease,
    qualify_candidate,
    read_release,
    real_judges,
)

profile_app = typer.Typer(no_args_is_help=True, help="Stack profiles (profiles/*.yaml).")
# Every line quotes what an index or a release says: never read as markup.
console = Console(highlight=False, soft_wrap=True, markup=False)
progress_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


@profile_app.command("check")
def check(
    name: Annotated[str, typer.Argument(
        metavar="PROFILE", help="a profile, e.g. vllm-ascend-0.13.0 (profiles/PROFILE.yaml)")],
    arch: Annotated[Optional[str], typer.Option(
        "--arch", help="x86_64 or aarch64 (default: every arch the profile lists)")] = None,
    python: Annotated[Optional[str], typer.Option(
        "--python", help="the nodes' Python, 3.Y (default: the profile's stack.python)")] = None,
    glibc: Annotated[str, typer.Option(
        "--glibc", help="the nodes' glibc, 2.Y (default: Ubuntu 22.04's, the OS of vllm-ascend's own images)")
    ] = DEFAULT_GLIBC,
    index_url: Annotated[Optional[list[str]], typer.Option(
        "--index-url", help="replaces the profile's indexes; repeatable: the first is pip's --index-url, the others "
                            "extra indexes of every step")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable result on stdout")] = False,
) -> int:
    """Resolve each pip install step of the profile with pip's own resolver, as a dry run for the nodes'
    platform, and print one line per problem: a pin no index has, wheels that do not cover the platform,
    a conflict, a package only an extra index has, an index that did not answer; then whether each platform's
    lock (`profile lock`) is this profile's, hashed and meets its pins; then the end state: what all the steps
    leave together, judged as the stack gate's `pip check` judges it, a problem for each complaint the profile
    does not accept (a file an index that did not answer holds is judged from a stand-in, and said so).
    Exits 1 on any problem.
    """
    profile = load_profile(name)
    platforms = platforms_to_check(profile, arch, python, glibc)
    indexes = Indexes()  # each project page read once, for the steps and for the end state
    result = check_profile(profile, platforms, index_url, progress_console.print, indexes)
    locks, lock_problem_count = lock_verdicts(profile, platforms)
    ends, end_problem_count = end_state_verdicts(profile, platforms, index_url, indexes)
    if as_json:
        console.print_json(json.dumps({**result.as_dict(), "locks": locks, "end_state": ends}))
    else:
        for line in [*locks, *ends, *result.lines()]:  # each platform's summary last, as before
            console.print(line, markup=False)
    return 1 if result.problem_count or lock_problem_count or end_problem_count else 0


def say(where: str, line: str) -> None:
    progress_console.print(f"{where}: {line}", markup=False)


@profile_app.command("lock")
def lock(
    name: Annotated[str, typer.Argument(metavar="PROFILE", help="a profile, e.g. vllm-ascend-0.18.0")],
    arch: Annotated[Optional[str], typer.Option(
        "--arch", help="x86_64 or aarch64 (default: every arch the profile lists)")] = None,
    python: Annotated[Optional[str], typer.Option(
        "--python", help="the nodes' Python, 3.Y (default: the profile's stack.python)")] = None,
    glibc: Annotated[Optional[str], typer.Option(
        "--glibc", help=f"the nodes' glibc, 2.Y (default: {DEFAULT_GLIBC}; with --router {ROUTER_GLIBC})")] = None,
    index_url: Annotated[Optional[list[str]], typer.Option(
        "--index-url", help="replaces the profile's indexes; repeatable: the first is the main index")] = None,
    router: Annotated[bool, typer.Option(
        "--router", help="lock the profile's vllm-router (gateways routing cache_aware) instead of its stack; "
                         "--python is then the gateways' system Python")] = False,
) -> int:
    """Resolve the profile's pip steps for the nodes' platform with uv, as a node runs them, judge what they
    leave as the stack gate's `pip check` does, and write it as one pinned set with sha256 hashes to
    profiles/locks/PROFILE.ARCH-pyPYTHON.txt. Exits 1, writing nothing for that platform, when the steps
    leave a complaint the profile does not accept or do not resolve. With --router: the profile's
    vllm-router pin and what it needs, to profiles/locks/vllm-router-VERSION.ARCH-pyPYTHON.txt."""
    profile = load_profile(name)
    if router:
        return lock_routers(profile, platforms_to_check(profile, arch, python, glibc or ROUTER_GLIBC), index_url)
    glibc = glibc or DEFAULT_GLIBC
    failed = 0
    for platform in platforms_to_check(profile, arch, python, glibc):
        try:
            made = lock_profile(profile, platform, index_url, functools.partial(say, f"{profile.name} {platform}"))
        except LockError as exc:
            console.print(f"{profile.name} {platform}: not locked: {exc}", markup=False)
            failed = 1
            continue
        path = lock_path(profile.name, platform)
        made.write(path)
        console.print(f"{profile.name} {platform}: {path} ({len(made.environment)} packages, "
                      f"{len(made.complaints)} accepted complaints)", markup=False)
    return failed


def lock_routers(profile: Profile, platforms: list[Platform], index_url: list[str] | None) -> int:
    """`profile lock --router`: the profile's vllm-router locked for each platform."""
    if profile.router is None:
        raise FleetError(f"profile {profile.name} pins no vllm-router (router: vllm_router: VERSION)")
    urls = index_url or ([profile.pip.index_url] if profile.pip.index_url else None)
    if not urls:
        raise FleetError(f"profile lock: profile {profile.name} names no pip index (its host data does): "
                         "give --index-url")
    failed = 0
    for platform in platforms:
        where = f"{profile.router.requirement} {platform}"
        try:
            text = lock_router(profile.router, platform, urls, functools.partial(say, where))
        except LockError as exc:
            console.print(f"{where}: not locked: {exc}", markup=False)
            failed = 1
            continue
        path = router_lock_path(profile.router, platform)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        console.print(f"{where}: {path}", markup=False)
    return failed


@profile_app.command("new")
def new(
    version: Annotated[Optional[str], typer.Argument(
        metavar="VERSION", help="a vllm-ascend release on the index, e.g. 0.23.0.post1")] = None,
    newest_rc: Annotated[bool, typer.Option(
        "--newest-rc", help="the newest release candidate (pre-release) the index lists, instead of VERSION")] = False,
    out: Annotated[Path, typer.Option(
        "--out", help="where the candidate (VERSION's profile name .yaml) and its locks (locks/) are written; not "
                      "the profiles a deploy reads")] = Path("candidates"),
    python: Annotated[str, typer.Option("--python", help="the nodes' Python, 3.Y")] = "3.11",
    glibc: Annotated[str, typer.Option(
        "--glibc", help="the nodes' glibc, 2.Y (default: Ubuntu 22.04's, the OS of vllm-ascend's own images)")
    ] = DEFAULT_GLIBC,
    index_url: Annotated[str, typer.Option("--index-url", help="the index the release is read from")
                         ] = "https://pypi.org/simple",
) -> int:
    """Write a candidate profile for a vllm-ascend release from what the index shows of it (its wheels'
    tags or its source archive, its Requires-Dist, upstream's Dockerfile and versioning policy in its source
    archive, the RECORDs of the wheels its steps resolve to), with each value the index cannot tell null and
    where to find it; run `profile check` and `profile lock` on it; print a go / no-go report. Exits 1 on
    no-go."""
    started = time.monotonic()
    if bool(version) == newest_rc:
        raise FleetError("profile new: give a VERSION (e.g. 0.23.0.post1) or --newest-rc, one of them")
    node_interpreter("profile new", python, glibc)
    indexes = Indexes()
    indexes.probe([index_url])
    if index_url in indexes.unanswered:
        raise FleetError(f"profile new: --index-url {index_url} did not answer ({indexes.unanswered[index_url]})")
    version = version or newest_prerelease(indexes, index_url)
    progress_console.print(f"profile new: {PROJECT} {version} from {index_url}", markup=False)
    release = read_release(indexes, index_url, version)
    judges = real_judges(indexes, progress_console.print)
    candidate = qualify_candidate(release, python, glibc, indexes, judges, progress_console.print)
    platforms = [Platform(arch, python, glibc) for arch in candidate.data.get("arch", [])]
    report = judge(candidate, platforms, judges, indexes, out, started)
    for line in report.lines():
        console.print(line, markup=False)
    return 0 if report.go else 1
