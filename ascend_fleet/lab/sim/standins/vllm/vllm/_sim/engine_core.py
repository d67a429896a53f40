"""The simulated server's engine-core processes: children that look like vLLM's in ps, watched as vLLM watches them.

Real vLLM runs each engine core in a process of its own (vllm/v1/engine/utils.py, CoreEngineProcManager), titled by
setproctitle in run_engine_core (vllm/v1/engine/core.py): `VLLM::EngineCore`, or `VLLM::EngineCore_DP<rank>` with
data parallelism. setproctitle writes the title over argv (what /proc/PID/cmdline and `ps -o args` show) and sets the
comm with prctl(PR_SET_NAME), which the kernel cuts to 15 characters (`VLLM::EngineCor`). The client waits on the
processes' sentinels in a thread (core_client.py, MPClient.start_engine_core_monitor) and so learns of a death at once.

The child here only sleeps: the simulated engine itself runs in the API server's process (engine.py).

An NPU's runtime error mid-serving (the lab writes it in the hardware file, `npu_runtime_errors`: NPU id -> ACL
error code) fails the engine's next step as vllm-ascend users report it (ACL stream synchronize failed, then the
engine core's fatal error and EngineDeadError: vllm-ascend issues 2349, 2763, 5661).
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TITLE_PREFIX = "VLLM"  # VLLM_PROCESS_NAME_PREFIX's default (vllm/envs.py)
NPU_RUNTIME_ERRORS = "npu_runtime_errors"  # the lab's hardware file: {"<NPU id>": <ACL error code>}
FAULT_POLL_SECONDS = 0.2  # how soon a busy engine reads a fault the lab wrote

# What a child runs, read from its standard input so that its command line is the title alone. It ignores SIGTERM
# and SIGINT: systemd's stop signals every process of the unit at once, and the API server, which drains its
# streams first, takes its engines down when it leaves (the pipe's end it holds closes with it, whatever ends it).
CHILD_PROGRAM = """\
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
with open("/proc/self/comm", "w") as comm:
    comm.write({title!r})
while os.read({fd}, 1):
    pass
"""


@dataclass(frozen=True)
class CoreName:
    """An engine core's process name (the client's log names it) and its title (ps shows it)."""

    name: str
    title: str


def core_names(ranks: list[int], data_parallel: bool, release: tuple[int, int]) -> list[CoreName]:
    """The names CoreEngineProcManager gives its processes (0.18.0 names a lone engine `EngineCore`; 0.11.0 and
    0.13.0 name every engine `EngineCore_DP<rank>`) and the titles run_engine_core sets (the rank only with data
    parallelism, in all three)."""
    return [CoreName(name=f"EngineCore_DP{rank}" if data_parallel or release < (0, 18) else "EngineCore",
                     title=f"{TITLE_PREFIX}::EngineCore" + (f"_DP{rank}" if data_parallel else ""))
            for rank in ranks]


class EngineCores:
    """The engine-core children of one server. `on_death(name, returncode)` runs once, in the event loop that
    started them, for the first to die while the server has not stopped them."""

    def __init__(self, names: list[CoreName], on_death: Callable[[str, int], None]):
        self.names = names
        self.on_death = on_death
        self.processes: list[subprocess.Popen] = []
        self._holds: list[int] = []  # the API server's ends of the children's pipes
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> None:
        """Start the children and a thread watching each; call from the server's event loop."""
        loop = asyncio.get_running_loop()
        for core in self.names:
            read_end, write_end = os.pipe()  # neither end is inherited by other children (PEP 446)
            process = subprocess.Popen([core.title], executable=sys.executable, stdin=subprocess.PIPE,
                                       pass_fds=(read_end,))
            os.close(read_end)
            self._holds.append(write_end)
            try:
                process.stdin.write(CHILD_PROGRAM.format(title=core.title, fd=read_end).encode())
                process.stdin.close()
            except BrokenPipeError:  # killed before it read its program: its watcher reports the death, as
                pass                 # for a core that dies loading (the raw pipe is closed all the same)
            self.processes.append(process)
            threading.Thread(target=self._watch, args=(loop, core.name, process), daemon=True,
                             name="MPClientEngineMonitor").start()

    def _watch(self, loop: asyncio.AbstractEventLoop, name: str, process: subprocess.Popen) -> None:
        returncode = process.wait()
        with self._lock:
            if self._stopping:
                return
            self._stopping = True  # the client reports the first death only (engine_dead is set then)
        loop.call_soon_threadsafe(self.on_death, name, returncode)

    def stop(self) -> None:
        """The server's own shutdown: no death to report; the children leave and are reaped."""
        with self._lock:
            self._stopping = True
        for hold in self._holds:
            os.close(hold)
        self._holds.clear()
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def npu_runtime_error(hardware_file: Path, npus: list[int]) -> tuple[int, int] | None:
    """The first of `npus` the lab's hardware file gives a runtime error, with its code."""
    try:
        errors = json.loads(hardware_file.read_text()).get(NPU_RUNTIME_ERRORS, {})
    except (FileNotFoundError, json.JSONDecodeError):  # being rewritten: read it next time
        return None
    return next(((npu, int(errors[str(npu)])) for npu in npus if str(npu) in errors), None)


async def fail_on_npu_runtime_error(hardware_file: Path, npus: list[int], engine, workers: int) -> None:
    """Fail the engine at its first step after one of its NPUs got a runtime error: the model runner's stream
    synchronize raises, the engine core logs its fatal error and sends ENGINE_CORE_DEAD (so the client's monitor
    says nothing of the process). With more than one worker, the executor's collective_rpc wraps the worker's
    error (vllm-ascend issue 2763; multiproc_executor.py get_response). An idle engine runs no step: what an
    idle engine does with a faulty NPU is not known, and nothing happens here until a request runs."""
    while not engine.dead:
        await engine.steps.wait_for_work()  # idle, nothing is read: polled always, this was ⅓ of an idle server's CPU
        await asyncio.sleep(FAULT_POLL_SECONDS)
        if not engine.steps.busy or (fault := npu_runtime_error(hardware_file, npus)) is None:
            continue
        error = f"ACL stream synchronize failed, error code:{fault[1]}"
        if workers > 1:
            error = f"Worker failed with error '{error}', please check the stack trace above for the root cause"
        engine.die("EngineCore encountered a fatal error.", f"RuntimeError: {error}")
