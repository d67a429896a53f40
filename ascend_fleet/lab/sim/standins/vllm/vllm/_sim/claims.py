"""What an instance holds exclusively on its node: NPUs, the HCCL port range, vLLM's internal port.

Everything is held by open file descriptors and sockets, so the kernel releases it
when the process exits, however it exits.
"""

import errno
import fcntl
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm._sim import runtime, versions
from vllm._sim.errors import StartupError

HCCL_DEFAULT_BASE_PORT = 60000
# The ports HCCL takes from HCCL_IF_BASE_PORT, a fact of the CANN it belongs to: CANN's environment variable
# reference (HCCL_IF_BASE_PORT) says 16 in its 8.0.0 edition (60000-60015) and 32 in 8.3.RC1's, 8.5.0's and
# 9.0.0's (60000-60031). 8.1 and 8.2 are not known (8.2.RC1's edition says 32, then reserves 60000-60015):
# taken as 16. The simulated HCCL reads its CANN's release, as the real one is that release; the
# product's span is the profile's (stack.hccl_port_span), which the lab so checks rather than copies.
HCCL_PORT_SPAN_FROM = "8.3.RC1"
HCCL_PORT_SPANS = (16, 32)  # before HCCL_PORT_SPAN_FROM, from it on


# The record the CANN toolkit's installer leaves, <ASCEND_TOOLKIT_HOME>/<arch>-linux/<this>, with `version=`.
TOOLKIT_RECORD = "ascend_toolkit_install.info"


def cann_version() -> str | None:
    """The release of the CANN toolkit at ASCEND_TOOLKIT_HOME, from its install record; None without one."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME")
    for record in sorted(Path(home).glob(f"*-linux/{TOOLKIT_RECORD}")) if home else ():
        for line in record.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "version":
                return value
    return None


def hccl_port_span(cann: str) -> int:
    """The ports CANN `cann`'s HCCL takes from HCCL_IF_BASE_PORT."""
    before, after = HCCL_PORT_SPANS
    return after if versions.version_key(cann) >= versions.version_key(HCCL_PORT_SPAN_FROM) else before


@dataclass
class Claims:
    """Open device files and listening sockets of one instance."""

    device_fds: dict[int, int] = field(default_factory=dict)
    sockets: list[socket.socket] = field(default_factory=list)
    hbm_adverts: list[Path] = field(default_factory=list)

    def release(self) -> None:
        for path in self.hbm_adverts:
            path.unlink(missing_ok=True)
        for sock in self.sockets:
            sock.close()
        for fd in self.device_fds.values():
            os.close(fd)


def _lock_holder(path: Path) -> str:
    """The pid holding a flock on `path`, from /proc/locks, for the error message."""
    st = path.stat()
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and inode in fields:
            return f"process {fields[fields.index('FLOCK') + 3]}"
    return "another process"


def claim_npus(claims: Claims, npus: list[int]) -> None:
    """Open and exclusively lock /dev/davinciN for every NPU the instance uses."""
    for npu in npus:
        path = runtime.device_file(npu)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as err:
            raise StartupError(f"cannot open NPU {npu} ({path}): {err.strerror} (the driver's device files are 0660 root:HwHiAiUser)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(
                f"NPU {npu} ({path}) is already in use by {_lock_holder(path)}; "
                "give each instance its own ASCEND_RT_VISIBLE_DEVICES"
            ) from None
        claims.device_fds[npu] = fd


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def hccl_bind_error(port: int, ports: range, cann: str) -> str:
    """HCCL's EJ0003 report, then the lab's hint: the range that collided and whose span it is."""
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S")
    return (
        f"EJ0003: [PID: {os.getpid()}] {stamp} Failed to bind the IP port. "
        "Reason: The IP address and port have been bound already. "
        f"(host nic listen start failed, port[{port}], HCCL range {ports[0]}-{ports[-1]} from HCCL_IF_BASE_PORT, "
        f"{len(ports)} ports on CANN {cann}; give each instance its own range)"
    )


def bind_hccl_ports(claims: Claims) -> range:
    """Listen on the whole HCCL port range like HCCL's host NIC does; returns the range. A port another
    process holds fails the start, as HCCL's bind does."""
    base = int(os.environ.get("HCCL_IF_BASE_PORT", HCCL_DEFAULT_BASE_PORT))
    host = os.environ.get("HCCL_IF_IP", "0.0.0.0")
    cann = cann_version()
    if cann is None:
        raise StartupError(f"no CANN toolkit record under ASCEND_TOOLKIT_HOME={os.environ.get('ASCEND_TOOLKIT_HOME')} "
                           f"(*-linux/{TOOLKIT_RECORD}): the lab's HCCL takes its port span from the "
                           "installed CANN's release; install the toolkit and source its set_env.sh")
    ports = range(base, base + hccl_port_span(cann))
    for port in ports:
        try:
            claims.sockets.append(_listen(host, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            raise StartupError(hccl_bind_error(port, ports, cann)) from None
    return ports


def bind_internal_port(claims: Claims, log) -> int:
    """Hold vLLM's internal port: VLLM_PORT, moving up past busy ports as vLLM's get_open_port does."""
    host = os.environ.get("VLLM_HOST_IP", "")
    port = int(os.environ.get("VLLM_PORT", 0))
    while True:
        try:
            sock = _listen(host, port)
        except OSError as err:
            if err.errno != errno.EADDRINUSE or port == 0:
                raise
            log.info("Port %d is already in use, trying port %d", port, port + 1)
            port += 1
            continue
        claims.sockets.append(sock)
        return sock.getsockname()[1]


def advertise_hbm(claims: Claims, npus: list[int], megabytes: int) -> None:
    """Tell the simulated npu-smi how much HBM this process holds on each NPU (when the driver runs)."""
    advert_root = runtime.node_path(runtime.HBM_ADVERT_DIR)
    if not advert_root.parent.is_dir():
        return  # no simulated driver state on this node: nothing reads the adverts
    for npu in npus:
        path = advert_root / str(npu) / str(os.getpid())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{megabytes}\n")
        claims.hbm_adverts.append(path)
