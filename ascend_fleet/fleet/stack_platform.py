"""Whether a node's platform (arch, glibc, the profile's Python) installs the wheels its stack pins.

Preflight asks this of every worker before anything on it changes: a node whose glibc is older
than a pinned wheel's manylinux tag (vllm-ascend 0.23.0's are all manylinux_2_34), or whose arch
or Python no wheel of a pin is built for, would otherwise stop at its pip step, after the driver,
firmware, reboot and CANN. The indexes' project pages are read on the control machine, once a run;
a pin an index lists no wheel of, and an index that does not answer here, are left to pip on the
node and to `ascend-fleet profile check`.
"""

from __future__ import annotations

from packaging.requirements import Requirement

from ascend_fleet.config.profile import Profile
from ascend_fleet.fleet.profile_check import Indexes, Platform, describe_wheels


def pinned_version(requirement: Requirement) -> bool:
    """An exact pin (`vllm-ascend==0.23.0`): the one version whose wheels decide."""
    return len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "=="


def uncovered_pins(profile: Profile, platform: Platform, index_url: str, indexes: Indexes) -> list[str]:
    """One line per pinned distribution of the install steps whose wheels (on the step's indexes)
    include none this platform installs: the pin, the platform and the tags its wheels have."""
    problems = []
    for step in profile.install_steps():
        urls = list(dict.fromkeys([index_url, *step.extra_index_urls]))
        indexes.probe(urls)
        for requirement in map(Requirement, step.requirements):
            if not pinned_version(requirement):
                continue
            wheels = [file for url in urls if url not in indexes.unanswered
                      for file in indexes.files(url, requirement.name)
                      if file.wheel and requirement.specifier.contains(file.wheel[0], prereleases=True)]
            if wheels and not any(file.wheel[1] & platform.tags for file in wheels):
                problems.append(f"{requirement} has no wheel for {platform}: {describe_wheels(wheels, platform.arch)}")
    return problems


def platform_problem(profile: Profile, arch: str, glibc: str | None, index_url: str,
                     indexes: Indexes) -> str | None:
    """Why this node cannot install the profile's pinned wheels, or None. `indexes` holds the index
    pages read so far (one per pyinfra run: per_run.once_per_run)."""
    if glibc is None:
        return ("no glibc found (`getconf GNU_LIBC_VERSION`): the stack's wheels are manylinux builds; "
                "use a glibc-based system")
    problems = uncovered_pins(profile, Platform(arch, profile.stack.python, glibc), index_url, indexes)
    if not problems:
        return None
    return (f"{problems[0]}{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}; use nodes of a "
            f"newer system or a profile whose wheels cover this one (`ascend-fleet profile check {profile.name} "
            f"--arch {arch} --glibc {glibc}`)")
