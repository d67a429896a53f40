"""Facts about a node's Ascend platform: driver, firmware, CANN, NPUs and who holds them.

Every command exits 0 whatever it finds (pyinfra treats a failing fact command as a
failed host); what is missing comes back as None or an empty result.
"""

from __future__ import annotations

import hashlib
import re
import shlex

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.command import make_formatted_string_command

from ascend_fleet.config.credentials import API_KEY_NAME
from ascend_fleet.core.node_layout import ANSWER_CACHE_DIR, INSTALL_LOCK
from ascend_fleet.core.versions import parse_range
from ascend_fleet.node.npu_metrics import parse_npu_smi_info

ASCEND_HOME = "/usr/local/Ascend"
# The longest a vendor installer may run (operations/vendor.py runs each under `timeout` this long).
INSTALL_TIMEOUT_SECONDS = 1800
# What is installed is read once no installer runs: one whose SSH session dropped runs on to its end,
# and a rerun that read its half-done work would install over it at the same time.
WAIT_FOR_INSTALLER = f"flock -w {INSTALL_TIMEOUT_SECONDS} {INSTALL_LOCK} true 2>/dev/null; "


def _key_values(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


class AscendDriver(FactBase):
    """The installed NPU driver, from driver/version.info:

    {"version": "25.2.0", "firmware_range": ("7.7.0", "7.7.99"), "complete": True} or None.
    `complete` is False when driver/tools/upgrade-tool is missing: a broken install.
    """

    def command(self, install_path: str = ASCEND_HOME) -> StringCommand:
        return make_formatted_string_command(
            WAIT_FOR_INSTALLER + "cat {0}/driver/version.info 2>/dev/null; "
            "test -x {0}/driver/tools/upgrade-tool && echo upgrade_tool=present; true", QuoteString(install_path))

    def process(self, output: list[str]) -> dict | None:
        values = _key_values(output)
        if "Version" not in values:
            return None
        fw_range = values.get("compatible_version_fw")
        return {
            "version": values["Version"],
            "firmware_range": parse_range(fw_range) if fw_range else None,
            "complete": values.get("upgrade_tool") == "present",
        }


class AscendFirmware(FactBase):
    """The installed NPU firmware version, from firmware/version.info, or None."""

    def command(self, install_path: str = ASCEND_HOME) -> StringCommand:
        return make_formatted_string_command(WAIT_FOR_INSTALLER + "cat {0}/firmware/version.info 2>/dev/null; true",
                                             QuoteString(install_path))

    def process(self, output: list[str]) -> str | None:
        return _key_values(output).get("Version")


class RunningFirmware(FactBase):
    """The firmware the NPUs run since the last boot, as `npu-smi info -t board -i 0` reports it
    (`Firmware Version : 7.1.0.7.220`), or None (no driver loaded). An installed firmware package
    takes effect only at the next reboot, so this can differ from AscendFirmware."""

    def command(self) -> str:
        return ("npu-smi info -t board -i 0 2>/dev/null | "
                "sed -n 's/^[[:space:]]*Firmware Version[[:space:]]*:[[:space:]]*//p'; true")

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() or None if output else None


class CannPackages(FactBase):
    """Installed CANN parts by their install records, with the toolkit's set_env.sh:

    {"toolkit": "8.5.0", "kernels": "8.5.0", "nnal": "8.5.0", "set_env": "/usr/local/Ascend/cann/set_env.sh"};
    missing parts are absent. Probes both layouts: ascend-toolkit/ (CANN <= 8.3) and cann/ (>= 8.5).
    """

    def command(self, install_path: str = ASCEND_HOME) -> str:
        base = shlex.quote(install_path)  # a shell loop: make_formatted_string_command would drop its quotes
        return (
            f"{WAIT_FOR_INSTALLER}for home in {base}/cann {base}/ascend-toolkit/latest; do "
            f"  for info in $home/*-linux/ascend_toolkit_install.info; do "
            f"    [ -f $info ] && echo toolkit=$(sed -n 's/^version=//p' $info) && echo toolkit_home=$home; "
            f"  done; "
            f"  for info in $home/*-linux/ascend_*ops_install.info; do "
            f"    [ -f $info ] && echo kernels=$(sed -n 's/^version=//p' $info); "
            f"  done; "
            # CANN <= 8.3's kernels: opp_kernel/version.info, the release as version_dir= (Version= is the build).
            f"  [ -f $home/opp_kernel/version.info ] && "
            f"echo kernels=$(sed -n 's/^[[:space:]]*version_dir=//p' $home/opp_kernel/version.info); "
            f"done; "
            f"for env in {base}/cann/set_env.sh {base}/ascend-toolkit/set_env.sh; do "
            f"  [ -f $env ] && echo set_env=$env && break; done; "
            # NNAL's record: "Ascend-cann-atb : 8.5.0" (indented on 8.x), beside "Ascend-cann-atb Version : <build>".
            f"[ -f {base}/nnal/atb/latest/version.info ] && echo nnal=$(sed -n "
            f"'s/^[[:space:]]*Ascend-cann-atb[[:space:]]*:[[:space:]]*//p' {base}/nnal/atb/latest/version.info); true"
        )

    def process(self, output: list[str]) -> dict:
        return _key_values(output)

    def default(self) -> dict:
        return {}


class NpuStatus(FactBase):
    """What `npu-smi info` says: {"ok": bool, "error": str, "npus": [{"id", "chip", "health",
    "hbm_used_mb", "hbm_total_mb"}]}. ok is False when npu-smi is missing or fails
    (driver not loaded, firmware not matching); error is then its own message."""

    def command(self) -> str:
        return ("if command -v npu-smi >/dev/null; then out=$(npu-smi info 2>&1); rc=$?; "
                "else out='npu-smi: not installed (no NPU driver)'; rc=127; fi; "
                "echo \"rc=$rc\"; printf '%s\\n' \"$out\"")

    def process(self, output: list[str]) -> dict:
        rc = int(output[0].split("=", 1)[1])
        body = output[1:]
        if rc != 0:
            return {"ok": False, "error": " ".join(line.strip() for line in body if line.strip()), "npus": []}
        # The same parser feeds the workers' NPU metrics (monitoring stage).
        return {"ok": True, "error": "", "npus": parse_npu_smi_info(body)}


class PciNpuCount(FactBase):
    """NPUs on the PCI bus (910B: Huawei device d802), for nodes whose driver is not loaded yet."""

    def command(self) -> str:
        return "if command -v lspci >/dev/null; then lspci -n -d 19e5:d802 | wc -l; else echo none; fi"

    def process(self, output: list[str]) -> int | None:
        return int(output[0]) if output and output[0].isdigit() else None


class NpuDeviceHolders(FactBase):
    """Processes holding /dev/davinci* open: [{"pid": 123, "command": "python3", "unit": "vllm@0.service"}]."""

    def command(self) -> str:
        return (
            "for fd in /proc/[0-9]*/fd/*; do "
            "  case $(readlink $fd 2>/dev/null) in /dev/davinci[0-9]*) pid=${fd#/proc/}; echo ${pid%%/*};; esac; "
            "done 2>/dev/null | sort -u | while read pid; do "
            "  echo \"$pid $(cat /proc/$pid/comm 2>/dev/null) $(sed -n 's|^0::.*/||p' /proc/$pid/cgroup 2>/dev/null)\"; "
            "done; true"
        )

    def process(self, output: list[str]) -> list[dict]:
        holders = []
        for line in output:
            pid, _, rest = line.partition(" ")
            command, _, unit = rest.partition(" ")
            holders.append({"pid": int(pid), "command": command, "unit": unit})
        return holders

    def default(self) -> list[dict]:
        return []


class Glibc(FactBase):
    """The node's glibc release, "2.36" (what pip reads to choose manylinux wheels); None without glibc."""

    def command(self) -> str:
        return "getconf GNU_LIBC_VERSION 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        match = re.fullmatch(r"glibc (\d+\.\d+)", output[0].strip()) if output else None
        return match[1] if match else None



def kept_answer(command: str, depends_on: list[str]) -> str:
    """Shell that prints what command prints, kept on the node (ANSWER_CACHE_DIR, one file per command)
    under the names and times of the files depends_on (globs) and run again only when they changed:
    for slow checks whose answer depends on those files alone."""
    cache = shlex.quote(f"{ANSWER_CACHE_DIR}/{hashlib.sha256(command.encode()).hexdigest()[:32]}")
    return (f"key=$(ls -ld --time-style=+%s.%N {' '.join(depends_on)} 2>/dev/null | sha256sum); "
            f'if [ "$(head -n 1 {cache} 2>/dev/null)" = "$key" ]; then tail -n +2 {cache}; exit 0; fi; '
            f"out=$( {command} ); {{ mkdir -p {ANSWER_CACHE_DIR} && printf '%s\\n' \"$key\" \"$out\" > {cache}.new "
            f"&& mv {cache}.new {cache}; }} 2>/dev/null; printf '%s\\n' \"$out\"")


def venv_distributions(venv: str) -> list[str]:
    """Globs of what tells a virtualenv's installed distributions apart: their metadata."""
    return [f"{shlex.quote(venv)}/lib/python*/site-packages/{pattern}"
            for pattern in ("*.dist-info", "*.dist-info/METADATA", "*.egg-info", "*.egg-info/PKG-INFO")]


class PipPackages(FactBase):
    """Distributions in a virtualenv: {"torch": "2.13.0+cpu", ...} (names normalised), {} if there is no venv.
    pip's listing (about 1 s) is kept on the node until the distributions change (kept_answer)."""

    def command(self, venv: str) -> str:
        python = shlex.quote(f"{venv}/bin/python")
        return (f"[ -x {python} ] || exit 0; "
                + kept_answer(f"{python} -m pip list --format=freeze 2>/dev/null", venv_distributions(venv)))

    def process(self, output: list[str]) -> dict[str, str]:
        packages = {}
        for line in output:
            name, sep, version = line.partition("==")
            if sep:
                packages[re.sub(r"[-_.]+", "-", name).lower()] = version
        return packages

    def default(self) -> dict[str, str]:
        return {}


class PipCheck(FactBase):
    """What `pip check` says of a virtualenv: one complaint a line ("vllm 0.18.0 has requirement torch==2.10.0,
    but you have torch 2.9.0."); [] when every requirement is met or there is no venv.

    pip check reads every distribution's metadata (about 2 s with the serving stack), and its answer
    depends on nothing else: kept on the node until an install, an uninstall or an edited METADATA."""

    def command(self, venv: str) -> str:
        python = shlex.quote(f"{venv}/bin/python")
        return (f"[ -x {python} ] || exit 0; "
                + kept_answer(f"{python} -m pip check --disable-pip-version-check 2>&1", venv_distributions(venv)))

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip() and line.strip() != "No broken requirements found."]

    def default(self) -> list[str]:
        return []


class SourcedEnvironment(FactBase):
    """The variables that sourcing these scripts sets or changes, from a clean environment:
    {"ASCEND_TOOLKIT_HOME": "...", "LD_LIBRARY_PATH": "...", ...}. Missing scripts are skipped.
    With venv, its bin comes first on PATH: NNAL's ATB script picks its C++ ABI build by asking
    the `python3` on PATH for torch's, and a system python3 without torch makes it take cxx11."""

    SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    def command(self, scripts: list[str], venv: str | None = None) -> str:
        path = f"{venv}/bin:{self.SYSTEM_PATH}" if venv else self.SYSTEM_PATH
        clean = f"env -i HOME=/root PATH={shlex.quote(path)}"
        sources = " ".join(f"[ -f {shlex.quote(s)} ] && . {shlex.quote(s)} >/dev/null 2>&1;" for s in scripts)
        sources = sources.replace("'", "'\\''")  # inside bash -c '...': a quoted script path's quotes
        # bash: NNAL's ATB set_env.sh is bash only, and sh is dash on Debian and Ubuntu.
        return f"{clean} bash -c 'env' | sed 's/^/before:/'; {clean} bash -c '{sources} env'"

    def process(self, output: list[str]) -> dict[str, str]:
        before = {line[7:] for line in output if line.startswith("before:")}
        changed = [line for line in output if not line.startswith("before:") and line not in before]
        return dict(line.split("=", 1) for line in changed if "=" in line and line.split("=", 1)[0] != "_")


class HttpAnswer(FactBase):
    """Status and body of an HTTP request made on the node: {"status": 200, "body": "..."};
    status 0 when nothing answered."""

    def command(self, url: str, json_body: str | None = None, timeout_seconds: int = 60,
                api_key_file: str | None = None) -> str:
        post = f"-H 'Content-Type: application/json' --data-binary {shlex.quote(json_body)} " if json_body else ""
        # The API key (a VLLM_API_KEY= line of a root-only env file) is read on the node and reaches
        # curl as a config line on stdin: no command line, here or in ps, holds it.
        key = (f"key=$(sed -n 's/^{API_KEY_NAME}=//p' {shlex.quote(api_key_file)} 2>/dev/null | tail -n 1); "
               if api_key_file else "key=; ")
        return (f"{key}body=$( {{ [ -z \"$key\" ] || printf 'header = \"Authorization: Bearer %s\"\\n' \"$key\"; }} | "
                f"curl -s -K - -m {timeout_seconds} {post}-w '\\n%{{http_code}}' {shlex.quote(url)} 2>/dev/null); "
                f"printf '%s\\n' \"$body\" | tail -n 1; printf '%s\\n' \"$body\" | sed '$d'")

    def process(self, output: list[str]) -> dict:
        status = output[0] if output else "000"
        return {"status": int(status) if status.isdigit() else 0, "body": "\n".join(output[1:])}


class HttpAnswers(FactBase):
    """HttpAnswer of several requests made one after another in one round trip (a deploy's gate asks
    an instance four things): a list of answers in the order of `requests`, each given as HttpAnswer's
    keyword arguments."""

    MARKER = "--- ascend-fleet answer"

    def command(self, requests: list[dict]) -> str:
        return "; ".join(f"echo '{self.MARKER}'; {HttpAnswer().command(**request)}" for request in requests)

    def process(self, output: list[str]) -> list[dict]:
        answers: list[list[str]] = []
        for line in output:
            if line == self.MARKER:
                answers.append([])
            elif answers:
                answers[-1].append(line)
        return [HttpAnswer().process(lines) for lines in answers]


class VenvPython(FactBase):
    """What a Python snippet prints in the serving virtualenv (last line), or its error:
    {"ok": True, "output": "..."} / {"ok": False, "output": "<last line of the traceback>"}."""

    def command(self, venv: str, code: str, env_scripts: list[str] | None = None,
                depends_on: list[str] | None = None) -> str:
        """depends_on: globs of the only files besides the venv's distributions the answer depends on;
        given, the answer is kept until one of them changes (kept_answer)."""
        # The first of the set_env.sh files that exists (none: the snippet runs without, and says why it fails).
        source = (f"for f in {' '.join(shlex.quote(script) for script in env_scripts)}; do "
                  "if [ -f \"$f\" ]; then . \"$f\" >/dev/null 2>&1; break; fi; done; ") if env_scripts else ""
        run = (f"out=$( {source}{shlex.quote(f'{venv}/bin/python')} -c {shlex.quote(code)} 2>&1 ); echo \"rc=$?\"; "
               f"printf '%s\\n' \"$out\" | tail -n 1")
        return run if depends_on is None else kept_answer(run, venv_distributions(venv) + depends_on)

    def process(self, output: list[str]) -> dict:
        return {"ok": output[0] == "rc=0", "output": output[1] if len(output) > 1 else ""}
