"""The running kernel and its headers packages, which the NPU driver builds its module against."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

# Whether a package is installed, and whether a repository the package manager reads lists it ($p: its name).
INSTALLED = {"dnf": 'rpm -q "$p" >/dev/null 2>&1',
             "apt": "dpkg-query -W -f='${Status}' \"$p\" 2>/dev/null | grep -q 'ok installed'"}
LISTED = {"dnf": 'dnf -q repoquery "$p" 2>/dev/null | grep -q .',
          "apt": 'apt-cache show "$p" >/dev/null 2>&1'}


def _named(template: str) -> str:
    """A package name with {kernel} as the shell's $kernel, the rest quoted."""
    before, found, after = template.partition("{kernel}")
    if not found:
        return shlex.quote(template)
    return "".join((shlex.quote(before) if before else "", '"$kernel"', shlex.quote(after) if after else ""))


class KernelHeaders(FactBase[dict]):
    """The running kernel (`uname -r`) and its headers packages, named from templates ({kernel}):

    {"kernel": "6.6.0-28.0.0.34.oe2403.aarch64", "installed": [...], "not_installed": [...],
     "listed": [...]}; listed: those not installed that the node's repositories list, asked only with
    ask_repositories (dnf asks every repository over the network, which a site without internet cannot answer).
    """

    def command(self, package_manager: str, templates: tuple[str, ...], ask_repositories: bool) -> str:
        listed = f"if {LISTED[package_manager]}; then echo listed $p; fi; " if ask_repositories else ""
        checks = [f"p={_named(template)}; if {INSTALLED[package_manager]}; then echo installed $p; "
                  f"else echo not_installed $p; {listed}fi" for template in templates]
        return "; ".join(['kernel=$(uname -r)', 'echo kernel "$kernel"', *checks, "true"])

    def process(self, output: list[str]) -> dict:
        found: dict = {"kernel": "", "installed": [], "not_installed": [], "listed": []}
        for line in output:
            key, _, value = line.partition(" ")
            if key == "kernel":
                found["kernel"] = value
            elif key in found:
                found[key].append(value)
        return found
