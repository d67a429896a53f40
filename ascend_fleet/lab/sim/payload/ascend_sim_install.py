"""Installer inside every simulated Ascend .run package: driver, firmware, CANN toolkit, kernels/ops, NNAL.

The package's makeself-style header checks and extracts the payload, then runs
`python3 ascend_sim_install.py <flags>` the way Huawei's packages run their install
script; package.json next to this file says which package and version this is.
Standard library only: it runs on a fresh node's system python3.
"""

import grp
import json
import os
import pwd
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import versions
import ascend_sim as sim

HERE = Path(__file__).resolve().parent
# A real installer waits at its prompts forever; the lab gives up so an unattended run fails instead of hanging.
PROMPT_TIMEOUT_S = 60
# Success, effective after a reboot. Huawei's packages exit 0 or 2 on success; deploys must accept both.
EXIT_REBOOT_REQUIRED = 2

ACTION_FLAGS = {"hdk": ("--full", "--upgrade", "--uninstall"), "cann": ("--install", "--upgrade", "--uninstall")}
MODIFIER_FLAGS = ("--quiet", "--nox11", "--install-for-all")
LABELS = {"driver": "Driver", "firmware": "Firmware", "toolkit": "Toolkit",
          "kernels": "Kernels", "ops": "Ops", "nnal": "NNAL"}
UNIT_NAME = "ascend-sim-driver.service"
NPU_SMI_LINK = "/usr/local/sbin/npu-smi"
UPGRADE_TOOL = """#!/bin/sh
# Lab stand-in for the driver's firmware flashing tool; the firmware package checks that it is here.
echo "upgrade-tool: simulated NPUs are flashed by the firmware package itself"
"""
TOOLKIT_SET_ENV = """# Lab stand-in for CANN {version}'s set_env.sh: sets the same variables the same way.
export LD_LIBRARY_PATH={base}/driver/lib64:{base}/driver/lib64/common:{base}/driver/lib64/driver:$LD_LIBRARY_PATH
export ASCEND_TOOLKIT_HOME={home}
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/lib64:${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/opskernel:\
${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/nnengine:\
${{ASCEND_TOOLKIT_HOME}}/opp/built-in/op_impl/ai_core/tbe/op_tiling/lib/linux/$(arch):$LD_LIBRARY_PATH
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/tools/aml/lib64:${{ASCEND_TOOLKIT_HOME}}/tools/aml/lib64/plugin:\
$LD_LIBRARY_PATH
export PYTHONPATH=${{ASCEND_TOOLKIT_HOME}}/python/site-packages:\
${{ASCEND_TOOLKIT_HOME}}/opp/built-in/op_impl/ai_core/tbe:$PYTHONPATH
export PATH=${{ASCEND_TOOLKIT_HOME}}/bin:${{ASCEND_TOOLKIT_HOME}}/compiler/ccec_compiler/bin:\
${{ASCEND_TOOLKIT_HOME}}/tools/ccec_compiler/bin:$PATH
export ASCEND_AICPU_PATH=${{ASCEND_TOOLKIT_HOME}}
export ASCEND_OPP_PATH=${{ASCEND_TOOLKIT_HOME}}/opp
export TOOLCHAIN_HOME=${{ASCEND_TOOLKIT_HOME}}/toolkit
export ASCEND_HOME_PATH=${{ASCEND_TOOLKIT_HOME}}
"""
ATB_SET_ENV = """#!/bin/bash
# Lab stand-in for NNAL {version}'s atb/set_env.sh, in the real script's dialect: bash only (`function`,
# `[[ ]]`, BASH_SOURCE; dash stops at the first of them), the C++ ABI from --cxx_abi=0|1, else from
# whether the python3 on PATH imports torch and was built with the cxx11 ABI.
function get_cxx_abi_option()
{{
    cxx_abi=""
    for option in "$@"; do
        [[ "$option" == "--cxx_abi=0" ]] && cxx_abi=0
        [[ "$option" == "--cxx_abi=1" ]] && cxx_abi=1
    done
    if [[ -z "$cxx_abi" ]]; then
        if ! python3 -c "import torch" &> /dev/null; then
            cxx_abi=1
        elif [[ $(python3 -c 'import torch; print(torch.compiled_with_cxx11_abi())') == "True" ]]; then
            cxx_abi=1
        else
            cxx_abi=0
        fi
    fi
}}

if [[ -f "${{BASH_SOURCE[0]}}" ]] && [[ "${{BASH_SOURCE[0]}}" =~ (^|/)set_env\\.sh$ ]]; then
    get_cxx_abi_option "$@"
    export ATB_HOME_PATH={atb}/latest/atb/cxx_abi_${{cxx_abi}}
    export LD_LIBRARY_PATH=${{ATB_HOME_PATH}}/lib:${{ATB_HOME_PATH}}/examples:${{ATB_HOME_PATH}}/tests/atbopstest:\
$LD_LIBRARY_PATH
    export PATH=${{ATB_HOME_PATH}}/bin:$PATH
else
    echo "There is no 'set_env.sh' to import"
fi
"""


class InstallError(Exception):
    """Stops the installation; the message is printed as the package's [ERROR] line."""


@dataclass(frozen=True)
class Options:
    action: str  # full | install | upgrade | uninstall
    quiet: bool = False
    install_for_all: bool = False
    install_path: str = sim.DEFAULT_BASE


def family(kind):
    return "hdk" if kind in ("driver", "firmware") else "cann"


def parse_options(kind, argv):
    """The package's command line; anything the real package would not accept is an error."""
    actions = ACTION_FLAGS[family(kind)]
    chosen, modifiers, install_path = [], set(), sim.DEFAULT_BASE
    for arg in argv:
        if arg in actions:
            chosen.append(arg)
        elif arg in MODIFIER_FLAGS:
            modifiers.add(arg)
        elif arg.startswith("--install-path="):
            install_path = arg.split("=", 1)[1].rstrip("/")
            if not install_path.startswith("/"):
                raise InstallError(f"--install-path needs an absolute directory, got {arg}")
        else:
            raise InstallError(f"Unsupported parameter {arg}; this package takes one of {' '.join(actions)} "
                               f"with {' '.join(MODIFIER_FLAGS)} --install-path=<dir>, or --check")
    if len(chosen) != 1:
        raise InstallError(f"give exactly one of {' '.join(actions)}")
    return Options(chosen[0][2:], "--quiet" in modifiers, "--install-for-all" in modifiers, install_path)


# --- output and prompts ----------------------------------------------------------

_label = "Package"


def log(level, message):
    stream = sys.stderr if level == "ERROR" else sys.stdout
    print(f"[{_label}] [{time.strftime('%Y-%m-%d %H:%M:%S')}] [{level}]{message}", file=stream, flush=True)


def ask(question):
    """One line typed at the terminal; no terminal (closed or silent stdin) is an error, not a hang."""
    print(question, end=" ", flush=True)
    answered = sys.stdin is not None and select.select([sys.stdin], [], [], PROMPT_TIMEOUT_S)[0]
    answer = sys.stdin.readline() if answered else ""
    if not answer:
        print()
        raise InstallError(f"no answer on the terminal to: {question} (stdin closed or silent for {PROMPT_TIMEOUT_S}s)")
    return answer.strip()


def accept_eula(opts):
    if opts.quiet:
        return
    if ask("Do you accept the EULA to install this package? [y/n]").lower() not in ("y", "yes"):
        raise InstallError("EULA not accepted; pass --quiet to accept it in unattended installs")


# --- shared file helpers ---------------------------------------------------------

def install_file(source, target, mode=0o644):
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)


def symlink(link, target):
    """Point `link` at `target` (a path as seen on the node), replacing what was there."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def update_install_info(node, values=None, drop_prefix=None):
    """Merge keys into /etc/ascend_install.info, or drop one component's keys on uninstall."""
    path = node.path(sim.INSTALL_INFO)
    info = sim.read_key_values(path)
    if drop_prefix:
        info = {key: value for key, value in info.items() if not key.startswith(drop_prefix)}
    info.update(values or {})
    sim.write_key_values(path, info)


# --- driver ------------------------------------------------------------------------

def check_driver_prerequisites():
    try:
        pwd.getpwnam(sim.HDK_USER)
        grp.getgrnam(sim.HDK_USER)
    except KeyError:
        user = sim.HDK_USER
        raise InstallError(f"user or group {user} does not exist; create them first: groupadd {user} && "
                           f"useradd -g {user} -d /home/{user} -m {user} -s /bin/bash") from None
    for tool, package in (("lspci", "pciutils"), ("ifconfig", "net-tools")):
        if shutil.which(tool) is None:
            raise InstallError(f"{tool} not found; install {package}")
    # `uname -r`, not os.uname(): a lab node of another distribution answers with its own kernel's release.
    release = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    build = Path(f"/lib/modules/{release}/build")
    if shutil.which("dkms") is None and not build.is_dir():
        # What the real installer does without headers: ask, which hangs an unattended run.
        source = ask(f"Neither dkms nor {build} found. Please input the kernel source path:")
        if not Path(source, "Makefile").is_file():
            raise InstallError(f"{source} is not a kernel source tree; install dkms or linux-headers-{release}")
    elif shutil.which("dkms") is not None and not (build / "include").exists():
        # DKMS builds the module against the running kernel's headers (dkms 3.0.10, prepare_kernel).
        raise InstallError(f"Error! Your kernel headers for kernel {release} cannot be found at "
                           f"/lib/modules/{release}/build or /lib/modules/{release}/source.")


def write_driver_files(node, driver, source_dir, base, for_all, install_boot_id):
    """Driver files, npu-smi, hccn_tool, the boot unit and the install records; no checks (the host's preinstall uses it too)."""
    driver_dir = node.path(base) / "driver"
    tools = driver_dir / "tools"
    for sub in ("lib64/common", "lib64/driver"):
        (driver_dir / sub).mkdir(parents=True, exist_ok=True)
    low, high = driver["fw_range"]
    sim.write_key_values(driver_dir / "version.info", {
        "Version": driver["version"], "package_version": driver["version"],
        "compatible_version_fw": f"[{low},{high}]"})
    install_file(source_dir / "ascend_sim.py", tools / "ascend_sim.py")
    install_file(Path(versions.__file__), tools / "versions.py")  # ascend_sim's own import
    install_file(source_dir / "ascend_sim_activate.py", tools / "ascend_sim_activate.py", 0o755)
    install_file(source_dir / "npu_smi.py", tools / "npu-smi", 0o755)
    # Only under tools/, not on PATH: vendor guides call it by this path or link it onto PATH by hand.
    install_file(source_dir / "hccn_tool.py", tools / "hccn_tool", 0o755)
    (tools / "upgrade-tool").write_text(UPGRADE_TOOL)
    (tools / "upgrade-tool").chmod(0o755)
    symlink(node.path(NPU_SMI_LINK), f"{base}/driver/tools/npu-smi")
    unit = node.path("/etc/systemd/system") / UNIT_NAME
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text((source_dir / UNIT_NAME).read_text().replace("@TOOLS_DIR@", f"{base}/driver/tools"))
    symlink(unit.parent / "sysinit.target.wants" / UNIT_NAME, f"/etc/systemd/system/{UNIT_NAME}")
    update_install_info(node, {"UserName": sim.HDK_USER, "UserGroup": sim.HDK_USER,
                               "Driver_Install_Type": "full", "Driver_Install_Path_Param": base,
                               "Driver_Install_For_All": "yes" if for_all else "no"})
    state = node.path(sim.STATE_DIR)
    state.mkdir(parents=True, exist_ok=True)
    (state / "driver.boot_id").write_text(install_boot_id + "\n")


def install_driver(pkg, opts):
    node = sim.Node()
    current = node.installed_driver()
    if opts.action == "upgrade" and current is None:
        raise InstallError("no driver is installed to upgrade; install it with --full")
    check_driver_prerequisites()
    firmware = node.installed_firmware()
    low, high = pkg["fw_range"]
    if firmware and not sim.in_range(firmware, low, high):
        log("WARNING", f"installed firmware {firmware} is outside this driver's compatible range [{low},{high}]; "
                       "install a compatible firmware before rebooting")
    loaded = node.loaded() or {}
    running = (current and current["version"] == pkg["version"] == loaded.get("driver_version")
               and not node.driver_reinstalled_this_boot())
    # Reinstalling the running version needs no reboot; anything else is loaded at the next boot.
    boot_id = node.driver_install_boot_id() if running else node.boot_id()
    write_driver_files(node, pkg, HERE, opts.install_path, opts.install_for_all, boot_id)
    if running:
        log("INFO", f"Driver package installed successfully! Version {pkg['version']} is already running.")
        return 0
    log("INFO", "Driver package installed successfully! Reboot needed for installation/upgrade to take effect!")
    return EXIT_REBOOT_REQUIRED


def uninstall_driver(pkg, opts):
    node = sim.Node()
    if node.installed_driver() is None:
        raise InstallError("no driver is installed")
    shutil.rmtree(node.driver_dir())
    for path in (NPU_SMI_LINK, f"/etc/systemd/system/sysinit.target.wants/{UNIT_NAME}",
                 f"/etc/systemd/system/{UNIT_NAME}", f"{sim.STATE_DIR}/driver.boot_id"):
        node.path(path).unlink(missing_ok=True)
    update_install_info(node, drop_prefix="Driver_")
    log("INFO", "Driver package uninstalled successfully! Reboot needed for uninstallation to take effect!")
    return EXIT_REBOOT_REQUIRED


# --- firmware ----------------------------------------------------------------------

def write_firmware_files(node, version, base):
    sim.write_key_values(node.path(base) / "firmware" / "version.info", {"Version": version})
    update_install_info(node, {"Firmware_Install_Type": "full", "Firmware_Install_Path_Param": base})


def install_firmware(pkg, opts):
    node = sim.Node()
    driver = node.installed_driver()
    if driver is None or not (node.driver_dir() / "tools" / "upgrade-tool").is_file():
        raise InstallError("no driver with tools/upgrade-tool is installed; install the driver package first")
    loaded = node.loaded()
    if loaded is not None and node.driver_reinstalled_this_boot():
        # Flashing goes through the running driver, which no longer matches the installed tools.
        raise InstallError(f"upgrade-tool cannot reach the NPUs: driver {driver['version']} is installed but "
                           f"{loaded['driver_version']} is running; reboot first (upgrade firmware before the driver)")
    current = node.installed_firmware()
    if opts.action == "upgrade" and current is None:
        raise InstallError("no firmware is installed to upgrade; install it with --full")
    if current == pkg["version"]:
        log("INFO", f"Firmware {current} is already installed; nothing to do.")
        return 0
    low, high = driver["fw_range"]
    if not sim.in_range(pkg["version"], low, high):
        log("WARNING", f"firmware {pkg['version']} is outside the compatible range [{low},{high}] "
                       f"of installed driver {driver['version']}")
    write_firmware_files(node, pkg["version"], opts.install_path)
    log("INFO", "Firmware package installed successfully! "
                "Reboot now or after driver installation for the installation/upgrade to take effect.")
    return EXIT_REBOOT_REQUIRED


def uninstall_firmware(pkg, opts):
    node = sim.Node()
    if node.installed_firmware() is None:
        raise InstallError("no firmware is installed")
    shutil.rmtree(node.firmware_dir())
    update_install_info(node, drop_prefix="Firmware_")
    log("INFO", "Firmware package uninstalled successfully! Reboot needed for uninstallation to take effect!")
    return EXIT_REBOOT_REQUIRED


# --- CANN toolkit --------------------------------------------------------------------

def toolkit_dirs(base, version):
    """(versioned install dir, the stable path set_env.sh points at, set_env.sh), as node paths."""
    if sim.is_ops_era(version):
        return f"{base}/cann-{version}", f"{base}/cann", f"{base}/cann/set_env.sh"
    return f"{base}/ascend-toolkit/{version}", f"{base}/ascend-toolkit/latest", f"{base}/ascend-toolkit/set_env.sh"


def installed_toolkits(node, base):
    """{version: versioned install dir} for every toolkit under base, both layouts."""
    records = [*node.path(base).glob("ascend-toolkit/*/*-linux/ascend_toolkit_install.info"),
               *node.path(base).glob("cann-*/*-linux/ascend_toolkit_install.info")]
    return {sim.read_key_values(record)["version"]: record.parent.parent for record in records}


def remove_toolkits(node, base, versions):
    """Remove toolkits with their stable link and set_env.sh, so no stale environment script is left to probe."""
    for version in versions:
        version_dir, home, set_env = toolkit_dirs(base, version)
        shutil.rmtree(node.path(version_dir), ignore_errors=True)
        node.path(home).unlink(missing_ok=True)
        node.path(set_env).unlink(missing_ok=True)


def install_toolkit(pkg, opts):
    node, version, arch, base = sim.Node(), pkg["version"], pkg["arch"], opts.install_path
    installed = installed_toolkits(node, base)
    if opts.action == "upgrade" and not installed:
        raise InstallError("no CANN toolkit is installed to upgrade; use --install")
    older_layout = [v for v in installed if not sim.is_ops_era(v)]
    if opts.action == "install" and sim.is_ops_era(version) and older_layout:
        raise InstallError(f"CANN {older_layout[0]} is installed under ascend-toolkit/; moving to {version} "
                           "needs --upgrade (or uninstall it first)")
    if opts.action == "upgrade":
        remove_toolkits(node, base, installed)
    version_dir, home, set_env = toolkit_dirs(base, version)
    platform = node.path(version_dir) / f"{arch}-linux"
    for sub in ("bin", "lib64", "opp", "python/site-packages"):
        (node.path(version_dir) / sub).mkdir(parents=True, exist_ok=True)
    sim.write_key_values(platform / "ascend_toolkit_install.info", {
        "package_name": "Ascend-cann-toolkit", "version": version, "arch": arch, "os": "linux",
        "path": f"{version_dir}/{arch}-linux"})
    symlink(node.path(home), Path(version_dir).name)
    node.path(set_env).write_text(TOOLKIT_SET_ENV.format(version=version, base=base, home=home))
    sim.write_key_values(node.path(sim.CANN_INSTALL_INFO), {"Install_Path": base})
    log("INFO", f"Ascend-cann-toolkit {version} install success; environment: source {set_env}")
    return 0


def uninstall_toolkit(pkg, opts):
    node, version, base = sim.Node(), pkg["version"], opts.install_path
    if version not in installed_toolkits(node, base):
        raise InstallError(f"CANN toolkit {version} is not installed under {base}")
    remove_toolkits(node, base, [version])
    if not installed_toolkits(node, base):
        node.path(sim.CANN_INSTALL_INFO).unlink(missing_ok=True)
    log("INFO", f"Ascend-cann-toolkit {version} uninstall success")
    return 0


# --- kernels / ops and NNAL (need the toolkit's environment) ----------------------------

def sourced_toolkit(pkg, base):
    """(ASCEND_HOME_PATH, its toolkit version); the toolkit's set_env.sh must have been sourced."""
    home = os.environ.get("ASCEND_HOME_PATH")
    set_env = f"{base}/ascend-toolkit/set_env.sh (CANN < 8.5) or {base}/cann/set_env.sh"
    if not home:
        raise InstallError(f"ASCEND_HOME_PATH is not set; source the CANN toolkit environment first: {set_env}")
    record = sim.read_key_values(Path(home) / f"{pkg['arch']}-linux" / "ascend_toolkit_install.info")
    if not record:
        raise InstallError(f"no CANN toolkit at ASCEND_HOME_PATH={home}; install the toolkit, then source {set_env}")
    return Path(home), record["version"]


def kernels_record(home, pkg):
    """CANN <= 8.3's kernels record their release in <toolkit>/opp_kernel/version.info, as real nodes
    print it (`Version=<build>`, `version_dir=<release>`, `timestamp=`, ...). 8.5's ops package
    record is of our own making: its real form is unknown (docs/sim-fidelity.md)."""
    if pkg["kind"] == "kernels":
        return home / "opp_kernel" / "version.info"
    return home / f"{pkg['arch']}-linux" / f"ascend_{pkg['kind']}_install.info"


def install_kernels(pkg, opts):
    home, toolkit_version = sourced_toolkit(pkg, opts.install_path)
    if toolkit_version != pkg["version"]:
        raise InstallError(f"{pkg['name']} {pkg['version']} needs CANN toolkit {pkg['version']}, but "
                           f"ASCEND_HOME_PATH has {toolkit_version}; install and source the matching toolkit")
    if pkg["kind"] == "kernels":
        # Only the release: the build (Version=) and timestamp of the lab's versions are unknown.
        kernels_record(home, pkg).parent.mkdir(parents=True, exist_ok=True)
        sim.write_key_values(kernels_record(home, pkg), {"version_dir": pkg["version"]})
    else:
        sim.write_key_values(kernels_record(home, pkg), {
            "package_name": pkg["name"], "version": pkg["version"], "arch": pkg["arch"]})
    log("INFO", f"{pkg['name']} {pkg['version']} install success")
    return 0


def uninstall_kernels(pkg, opts):
    record = kernels_record(sim.Node().path(toolkit_dirs(opts.install_path, pkg["version"])[0]), pkg)
    if not record.is_file():
        raise InstallError(f"{pkg['name']} {pkg['version']} is not installed")
    record.unlink()
    log("INFO", f"{pkg['name']} {pkg['version']} uninstall success")
    return 0


def install_nnal(pkg, opts):
    sourced_toolkit(pkg, opts.install_path)
    atb = f"{opts.install_path}/nnal/atb"
    version_dir = sim.Node().path(atb) / pkg["version"]
    for abi in ("cxx_abi_0", "cxx_abi_1"):
        for sub in ("lib", "bin"):
            (version_dir / "atb" / abi / sub).mkdir(parents=True, exist_ok=True)
    # NNAL's record, as real nodes show it (`cat /usr/local/Ascend/nnal/atb/latest/version.info`):
    # indented "key : value" lines; the build line (Ascend-cann-atb Version : <v>.B<n>) is not known for the
    # lab's versions and is left out.
    (version_dir / "version.info").write_text(f"    Ascend-cann-atb : {pkg['version']}\n"
                                              f"    Platform : {pkg['arch']}\n")
    symlink(version_dir.parent / "latest", pkg["version"])
    (version_dir.parent / "set_env.sh").write_text(ATB_SET_ENV.format(version=pkg["version"], atb=atb))
    log("INFO", f"Ascend-cann-nnal {pkg['version']} install success; environment: source {atb}/set_env.sh")
    return 0


def uninstall_nnal(pkg, opts):
    atb = sim.Node().path(f"{opts.install_path}/nnal/atb")
    if not (atb / pkg["version"]).is_dir():
        raise InstallError(f"NNAL {pkg['version']} is not installed")
    shutil.rmtree(atb / pkg["version"])
    for name in ("latest", "set_env.sh"):
        (atb / name).unlink(missing_ok=True)
    log("INFO", f"Ascend-cann-nnal {pkg['version']} uninstall success")
    return 0


HANDLERS = {
    "driver": {"full": install_driver, "upgrade": install_driver, "uninstall": uninstall_driver},
    "firmware": {"full": install_firmware, "upgrade": install_firmware, "uninstall": uninstall_firmware},
    "toolkit": {"install": install_toolkit, "upgrade": install_toolkit, "uninstall": uninstall_toolkit},
    "kernels": {"install": install_kernels, "upgrade": install_kernels, "uninstall": uninstall_kernels},
    "ops": {"install": install_kernels, "upgrade": install_kernels, "uninstall": uninstall_kernels},
    "nnal": {"install": install_nnal, "upgrade": install_nnal, "uninstall": uninstall_nnal},
}


def main(argv):
    global _label
    pkg = json.loads((HERE / "package.json").read_text())
    _label = LABELS[pkg["kind"]]
    try:
        opts = parse_options(pkg["kind"], argv)
        if os.geteuid() != 0:
            raise InstallError("this package installs as root only; rerun it as root")
        if opts.action != "uninstall":
            accept_eula(opts)
        return HANDLERS[pkg["kind"]][opts.action](pkg, opts)
    except InstallError as error:
        log("ERROR", str(error))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
