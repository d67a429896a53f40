"""The lab's openEuler repository: stand-in RPMs with openEuler 24.03 LTS's package names and
versions and files at openEuler's paths, whose content is Debian's (extracted from the Debian
package that does the same job), built once with rpmbuild and createrepo_c and cached.

Served by the lab mirror at /openeuler/openEuler-24.03-LTS/OS/<arch>/ as repo.openeuler.org serves
the real one; docs/sim-fidelity.md ("openEuler lab node") says what each stand-in really is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ascend_fleet.lab.host import run
from ascend_fleet.lab.spec import CACHE_DIR

RPM_CACHE = CACHE_DIR / "rpms"
RELEASE = "openEuler-24.03-LTS"
RPM_ARCH = {"x86_64": "x86_64", "aarch64": "aarch64"}
# A change to how stand-ins are built (_build) rebuilds them: bump it.
BUILDER = 1
# openEuler.repo's sections and where each baseurl points below the release (repo.openeuler.org's layout).
REPOSITORIES = {"OS": "OS/$basearch", "everything": "everything/$basearch", "EPOL": "EPOL/main/$basearch",
                "debuginfo": "debuginfo/$basearch", "source": "source", "update": "update/$basearch",
                "update-source": "update/source"}

NGINX_CONF = """\
# The openEuler nginx package's layout: this file, conf.d/ for the sites, default.d/ for the default server.
user nginx;
worker_processes auto;
error_log /var/log/nginx/error.log;
pid /run/nginx.pid;

include /usr/share/nginx/modules/*.conf;

events {
    worker_connections 1024;
}

http {
    log_format  main  '$remote_addr - $remote_user [$time_local] "$request" '
                      '$status $body_bytes_sent "$http_referer" '
                      '"$http_user_agent" "$http_x_forwarded_for"';
    access_log  /var/log/nginx/access.log  main;
    sendfile            on;
    tcp_nopush          on;
    keepalive_timeout   65;
    types_hash_max_size 4096;
    include             /etc/nginx/mime.types;
    default_type        application/octet-stream;
    include /etc/nginx/conf.d/*.conf;

    server {
        listen       80;
        listen       [::]:80;
        server_name  _;
        root         /usr/share/nginx/html;
        include /etc/nginx/default.d/*.conf;
    }
}
"""
NGINX_UNIT = """\
[Unit]
Description=The nginx HTTP and reverse proxy server
After=network-online.target remote-fs.target nss-lookup.target
Wants=network-online.target

[Service]
Type=forking
PIDFile=/run/nginx.pid
ExecStartPre=/usr/bin/rm -f /run/nginx.pid
ExecStartPre=/usr/sbin/nginx -t
ExecStart=/usr/sbin/nginx
ExecReload=/usr/sbin/nginx -s reload
KillSignal=SIGQUIT
TimeoutStopSec=5
KillMode=mixed
PrivateTmp=true

[Install]
WantedBy=multi-user.target
"""
NODE_EXPORTER_UNIT = """\
[Unit]
Description=Prometheus exporter for machine metrics
After=network.target

[Service]
EnvironmentFile=-/etc/sysconfig/node_exporter
ExecStart=/usr/bin/node_exporter $OPTIONS
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


@dataclass(frozen=True)
class StandIn:
    """One RPM: name, version and release as openEuler's; debs: the Debian packages its files come
    from; take: (path in those debs, path in the RPM); files: (path, content) of its own; dirs: empty
    directories it owns; pre: its %pre scriptlet."""

    name: str
    version: str
    release: str
    summary: str
    debs: tuple[str, ...] = ()
    take: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    dirs: tuple[str, ...] = ()
    pre: str = ""
    provides: tuple[str, ...] = field(default=())


# What the product's stages install on an openEuler worker.
STANDINS = (
    StandIn("nginx", "1.24.0", "10.oe2403", "A high performance web server and reverse proxy server",
            debs=("nginx", "nginx-common"),
            take=(("usr/sbin/nginx", "usr/sbin/nginx"), ("etc/nginx/mime.types", "etc/nginx/mime.types")),
            files=(("etc/nginx/nginx.conf", NGINX_CONF), ("usr/lib/systemd/system/nginx.service", NGINX_UNIT),
                   ("usr/share/nginx/html/index.html", "openEuler nginx (lab stand-in)\n")),
            dirs=("etc/nginx/conf.d", "etc/nginx/default.d", "usr/share/nginx/modules", "var/lib/nginx",
                  "var/log/nginx"),
            pre="getent group nginx >/dev/null || groupadd -r nginx\n"
                "getent passwd nginx >/dev/null || useradd -r -g nginx -s /sbin/nologin -d /var/lib/nginx nginx\n"),
    StandIn("node_exporter", "1.7.0", "1.oe2403", "Prometheus exporter for hardware and OS metrics",
            debs=("prometheus-node-exporter",),
            take=(("usr/bin/prometheus-node-exporter", "usr/bin/node_exporter"),),
            files=(("usr/lib/systemd/system/node_exporter.service", NODE_EXPORTER_UNIT),)),
    StandIn("nftables", "1.0.9", "1.oe2403", "Netfilter Tables userspace utilities", debs=("nftables",),
            take=(("usr/sbin/nft", "usr/sbin/nft"),)),
    StandIn("pciutils", "3.10.0", "3.oe2403", "PCI bus related utilities", debs=("pciutils", "libpci3", "pci.ids"),
            take=(("usr/bin/lspci", "usr/sbin/lspci"), ("usr/bin/setpci", "usr/sbin/setpci"), ("usr/lib", "usr/lib"),
                  ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids"))),
    StandIn("net-tools", "2.10", "4.oe2403", "Basic networking tools", debs=("net-tools",),
            take=(("sbin", "usr/sbin"), ("bin/netstat", "usr/bin/netstat"))),
    StandIn("make", "4.4.1", "1.oe2403", "A GNU tool which simplifies the build process", debs=("make",),
            take=(("usr/bin/make", "usr/bin/make"),)),
    StandIn("dkms", "3.0.12", "1.oe2403", "Dynamic Kernel Module Support Framework", debs=("dkms",),
            take=(("usr/sbin/dkms", "usr/sbin/dkms"), ("etc/dkms", "etc/dkms"), ("usr/lib/dkms", "usr/lib/dkms"))),
    # Name and version only: the lab compiles nothing.
    StandIn("gcc", "12.3.1", "38.oe2403", "Various compilers (C, C++, Objective-C, ...)"),
)
# The kernel a lab openEuler node boots (VERSION, RELEASE of its package): a captured 24.03 LTS host's. Its
# `uname -r` is VERSION-RELEASE.ARCH (openEuler's kernel.spec: KernelVer %{version}-%{release}.%{_target_cpu}).
KERNEL = ("6.6.0", "28.0.0.34.oe2403")
# A later 24.03 LTS kernel (another captured host's), which the release's update repository carries: the newest
# kernel-devel there is not the running kernel's.
UPDATED_KERNEL = ("6.6.0", "112.0.0.104.oe2403")
# What an openEuler 24.03 server has installed before any deploy, registered in the base image's rpm
# database (rpm --justdb): their files are the Debian base's own.
PREINSTALLED = (
    StandIn("openEuler-release", "24.03LTS", "55.oe2403", "openEuler release file", provides=("system-release",
            "system-release(releasever) = 24.03LTS")),
    # Provides /bin/sh, which every scriptlet requires.
    StandIn("bash", "5.2.15", "9.oe2403", "The GNU Bourne Again shell", provides=("/bin/sh",)),
    StandIn("python3", "3.11.6", "3.oe2403", "Interpreter of the Python3 programming language",
            provides=("python(abi) = 3.11", "python3.11")),
    StandIn("firewalld", "1.2.6", "6.oe2403", "A firewall daemon with D-Bus interface providing a dynamic firewall"),
    StandIn("dnf", "4.16.2", "6.oe2403", "Package manager"),
)


def kernel_release(arch: str, kernel: tuple[str, str] = KERNEL) -> str:
    """The kernel's `uname -r`."""
    return f"{kernel[0]}-{kernel[1]}.{arch}"


def kernel_standins(arch: str, kernel: tuple[str, str]) -> tuple[StandIn, ...]:
    """kernel-devel and kernel-headers of a kernel: the tree DKMS builds against, /usr/src/kernels/<uname -r>
    with its include/ (the kernel package links /lib/modules/<uname -r>/build to it), and a uapi header."""
    version, release = kernel
    tree = f"usr/src/kernels/{kernel_release(arch, kernel)}"
    return (StandIn("kernel-devel", version, release, "Development package for building kernel modules",
                    files=((f"{tree}/Makefile", f"# lab stand-in: kernel {kernel_release(arch, kernel)}\n"),
                           (f"{tree}/include/generated/utsrelease.h",
                            f'#define UTS_RELEASE "{kernel_release(arch, kernel)}"\n'))),
            StandIn("kernel-headers", version, release, "Header files for the Linux kernel for use by glibc",
                    files=(("usr/include/linux/version.h", f"/* lab stand-in: kernel {version}-{release} */\n"),)))


def preinstalled_key() -> str:
    return _key(PREINSTALLED)


def preinstalled_rpms() -> list[Path]:
    """The preinstalled stand-ins' RPM files (metadata only), built once."""
    return _built(PREINSTALLED, "noarch", RPM_CACHE / f"preinstalled-{preinstalled_key()}")


def repository(arch: str) -> Path:
    """The stand-in repository for arch (RPMs and createrepo_c's repodata), built once. It holds the
    preinstalled packages too, as openEuler's OS repository does (a bundle of a node's packages takes
    python3 from it)."""
    standins = STANDINS + kernel_standins(arch, KERNEL)
    repo = RPM_CACHE / f"{RELEASE}-{arch}-{_key(standins + PREINSTALLED)}"
    _built(standins, RPM_ARCH[arch], repo, also=preinstalled_rpms())
    return repo


def update_repository(arch: str) -> Path:
    """The update repository's stand-ins: the later kernel's kernel-devel and kernel-headers, built once."""
    standins = kernel_standins(arch, UPDATED_KERNEL)
    repo = RPM_CACHE / f"{RELEASE}-update-{arch}-{_key(standins)}"
    _built(standins, RPM_ARCH[arch], repo)
    return repo


def publish(mirror_root: Path, arch: str) -> None:
    """Every repository openEuler.repo names, on the mirror at its real path: OS holds the stand-ins, update
    a later kernel's headers, the others are empty (dnf fails on a repository that does not answer, as on a
    real node)."""
    empty = RPM_CACHE / "empty"
    _built((), "noarch", empty)
    filled = {"OS": repository(arch), "update": update_repository(arch)}
    for name, path in REPOSITORIES.items():
        target = mirror_root / "openeuler" / RELEASE / path.replace("$basearch", arch)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(filled.get(name, empty), target, copy_function=os.link)


def _key(standins: tuple[StandIn, ...]) -> str:
    return hashlib.sha256(json.dumps([BUILDER, *(asdict(s) for s in standins)]).encode()).hexdigest()[:12]


def _built(standins: tuple[StandIn, ...], arch: str, repo: Path, also: list[Path] = ()) -> list[Path]:
    """repo/Packages/*.rpm for standins and the RPMs also (and repo/repodata), built under a lock if missing."""
    packages = repo / "Packages"
    done = repo / ".complete"
    if not done.exists():
        repo.parent.mkdir(parents=True, exist_ok=True)
        with open(repo.with_name(repo.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(repo, ignore_errors=True)
                packages.mkdir(parents=True)
                with tempfile.TemporaryDirectory(prefix="rpmbuild-", dir=repo.parent) as work:
                    for standin in standins:
                        _build(standin, arch, Path(work), packages)
                for rpm in also:
                    shutil.copy2(rpm, packages / rpm.name)
                run(["createrepo_c", "--quiet", str(repo)], what=f"createrepo_c {repo}")
                done.touch()
    return sorted(packages.glob("*.rpm"))


def _build(standin: StandIn, arch: str, work: Path, packages: Path) -> None:
    """rpmbuild -bb of one stand-in: its files staged from the Debian packages and its own."""
    staged = work / standin.name / "root"
    staged.mkdir(parents=True)
    if standin.debs:
        extracted = work / standin.name / "debs"
        extracted.mkdir()
        downloads = work / standin.name / "downloads"
        downloads.mkdir()
        run(["apt-get", "download", "-q", *standin.debs], cwd=downloads, what=f"the Debian packages of {standin.name}")
        for deb in downloads.glob("*.deb"):
            run(["dpkg-deb", "-x", str(deb), str(extracted)], what=f"unpacking {deb.name}")
        for source, target in standin.take:
            _copy(extracted / source, staged / target)
    for path, content in standin.files:
        (staged / path).parent.mkdir(parents=True, exist_ok=True)
        (staged / path).write_text(content)
    for directory in standin.dirs:
        (staged / directory).mkdir(parents=True, exist_ok=True)
    paths = sorted("/" + str(p.relative_to(staged)) for p in staged.rglob("*") if not p.is_dir() or p.is_symlink())
    dirs = sorted("/" + d for d in standin.dirs)
    spec = work / standin.name / f"{standin.name}.spec"
    spec.write_text("\n".join([
        f"Name: {standin.name}", f"Version: {standin.version}", f"Release: {standin.release}",
        f"Summary: {standin.summary} (ascend-fleet lab stand-in)", "License: lab stand-in", f"BuildArch: {arch}",
        "AutoReqProv: no", *(f"Provides: {p}" for p in standin.provides),
        "%description", "A stand-in for openEuler's package of this name and version: files from Debian's package.",
        *(["%pre", standin.pre] if standin.pre else []),
        "%install", f"cp -a {staged}/. %{{buildroot}}/",
        "%files", *paths, *(f"%dir {d}" for d in dirs), ""]))
    # Fast gzip: the payloads are Debian's binaries, built once; no debuginfo or build-id links.
    run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {work / standin.name}",
         "--define", f"_rpmdir {packages}", "--define", "_build_id_links none",
         "--define", "debug_package %{nil}", "--define", "_binary_payload w1.gzdio",
         "--define", "__os_install_post %{nil}",
         "--define", "_rpmfilename %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
         "--target", arch, str(spec)], what=f"rpmbuild of {standin.name}")


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target, follow_symlinks=False)
