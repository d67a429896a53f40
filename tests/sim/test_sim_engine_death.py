"""A simulated vLLM server whose engine-core process dies, as real vLLM's does (issue 34).

What vLLM 0.18.0 and 0.13.0 do (vllm/v1/engine/core_client.py, async_llm.py, entrypoints/launcher.py,
entrypoints/openai/server_utils.py, serving_chat.py, serving_completion.py) is in docs/sim-fidelity.md,
"Engine death and NPU faults mid-serving"; these tests hold the simulator to it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from ascend_fleet.lab.processes import children
from tests.sim.conftest import node_root
from tests.sim.test_sim_server import SimServer, sse_events

DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
BOUND = 20  # seconds any one wait in these tests may take
NO_WATCHDOG = {"VLLM_SIM_WATCHDOG_SECONDS": "3600"}  # only a request's 500 stops the server
STREAM = {"prompt": "keep going", "max_tokens": 200, "stream": True, "ignore_eos": True}


def kill(pid: int) -> None:
    """kill -9, as an operator or the OOM killer would."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def running(pid: int) -> bool:
    """pid is a live process (a zombie is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def engine_core(server: SimServer) -> int:
    """The server's one child: its engine core."""
    deadline = time.monotonic() + BOUND
    while not (pids := children(server.process.pid)):
        assert time.monotonic() < deadline and server.process.poll() is None, server.output()
        time.sleep(0.05)
    assert len(pids) == 1, pids
    return pids[0]


def exit_status(server: SimServer) -> int:
    return server.process.wait(timeout=BOUND)


def test_the_engine_core_is_a_child_titled_as_vllm_titles_it(start):
    server = start()
    server.health_statuses()
    core = engine_core(server)
    # setproctitle writes the title over argv and sets the comm, which the kernel cuts to 15 characters
    assert Path(f"/proc/{core}/cmdline").read_bytes().rstrip(b"\0") == b"VLLM::EngineCore"
    assert Path(f"/proc/{core}/comm").read_text().strip() == "VLLM::EngineCor"
    assert server.stop() == 0
    assert not running(core)


def test_a_killed_engine_core_ends_the_stream_with_the_error_then_health_is_503_and_a_request_500s(start):
    server = start(env=NO_WATCHDOG)
    server.health_statuses()
    core = engine_core(server)
    stream = server.post("/v1/completions", STREAM)
    assert stream.status == 200 and stream.readline().startswith(b"data: ")  # under way
    kill(core)
    events = sse_events(stream)
    # the 200 was sent: the error is the next event, then [DONE]
    assert json.loads(events[-2]) == {"error": {"message": DEAD, "type": "InternalServerError", "param": None,
                                                "code": 500}}
    assert events[-1] == "[DONE]" and len(events) < STREAM["max_tokens"]
    assert server.get("/health")[0] == 503  # check_health raises EngineDeadError
    assert server.post("/tokenize", {"prompt": "hi"}).status == 200  # no engine involved
    refused = server.post("/v1/completions", STREAM)  # refused before its stream starts
    assert refused.status == 500
    assert json.loads(refused.read())["error"] == {"message": DEAD, "type": "InternalServerError", "param": None,
                                                   "code": 500}
    assert exit_status(server) == 0  # terminate_if_errored in the error handler: uvicorn stops
    log = server.output()
    assert "Engine core proc EngineCore died unexpectedly, shutting down client." in log
    assert "AsyncLLM output_handler failed." in log and "Error in completion stream generator." in log
    assert not running(core)


def test_a_request_in_flight_without_streaming_gets_500_and_the_server_exits_at_once(start):
    server = start(env=NO_WATCHDOG)
    server.health_statuses()
    core = engine_core(server)
    replies = []
    waiting = threading.Thread(target=lambda: replies.append(server.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
                                 "ignore_eos": True})))
    waiting.start()
    time.sleep(0.5)  # in the engine's batch
    kill(core)
    waiting.join(BOUND)
    assert replies[0].status == 500 and json.loads(replies[0].read())["error"]["message"] == DEAD
    assert exit_status(server) == 0


def test_an_idle_server_whose_engine_core_is_killed_answers_503_until_its_watchdog_stops_it(start):
    server = start()
    server.health_statuses()
    kill(engine_core(server))
    killed = time.monotonic()
    answers = []
    while server.process.poll() is None:
        try:
            answers.append(server.get("/health")[0])
        except OSError:  # stopping
            pass
        # Nothing requested: the 5 s watchdog stops it (a loose bound: a loaded CI machine lags it by seconds).
        assert time.monotonic() - killed < 5 + 15, answers
        time.sleep(0.02)
    assert server.process.returncode == 0
    # a 200 can come before the monitor thread's notice, as in vLLM; none after a 503
    assert 200 not in answers[answers.index(503):] if 503 in answers else set(answers) <= {200}, answers


def test_on_0_13_the_stream_error_is_a_400_event_and_the_500_has_no_body(start):
    server = start("0.13.0", env=NO_WATCHDOG)
    server.health_statuses()
    core = engine_core(server)
    stream = server.post("/v1/completions", STREAM)
    assert stream.readline().startswith(b"data: ")
    kill(core)
    events = sse_events(stream)
    # create_streaming_error_response(str(e)) takes its defaults
    assert json.loads(events[-2]) == {"error": {"message": DEAD, "type": "BadRequestError", "param": None,
                                                "code": 400}}
    refused = server.post("/v1/completions", STREAM)
    assert (refused.status, refused.read()) == (500, b"")  # runtime_exception_handler: Response(500)
    assert exit_status(server) == 0
    assert "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client." in server.output()


def test_an_engine_core_killed_while_loading_fails_the_start_with_status_1(start):
    server = start(env={"VLLM_SIM_LOAD_BASE_SECONDS": "3"})
    kill(engine_core(server))
    assert exit_status(server) == 1
    assert ("RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore': -9}") in server.output()


def test_a_killed_server_takes_its_engine_core_with_it(start):
    server = start()
    server.health_statuses()
    core = engine_core(server)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    deadline = time.monotonic() + BOUND
    while running(core):
        assert time.monotonic() < deadline, "the engine core outlived its server"
        time.sleep(0.05)


def rewrite_hardware(root: Path, **changes) -> None:
    """The lab's way to change a node's simulated NPUs while it runs (tests/lab: rewrite_hardware)."""
    hardware = root / "etc/ascend-lab/hardware.json"
    hardware.write_text(json.dumps({**json.loads(hardware.read_text()), **changes}))


def test_an_npu_alarm_alone_leaves_the_engine_serving(start, tmp_path):
    """What an npu-smi health Alarm does to a serving engine is not known (docs/sim-fidelity.md): the lab
    changes nothing in serving, and the product must isolate such an instance itself."""
    root = node_root(tmp_path / "alarm")
    server = start(root=root)
    server.health_statuses()
    rewrite_hardware(root, npu_health=["Alarm", "Critical", "OK", "OK"])
    reply = server.post("/v1/completions", {"prompt": "still there", "max_tokens": 4})
    assert reply.status == 200 and json.loads(reply.read())["usage"]["completion_tokens"] == 4
    assert server.get("/health")[0] == 200
    assert server.stop() == 0


def test_an_npu_runtime_error_fails_the_next_step_as_the_engine_cores_own_fatal_error(start, tmp_path):
    root = node_root(tmp_path / "faulty")
    server = start(env=NO_WATCHDOG, root=root)
    server.health_statuses()
    stream = server.post("/v1/completions", STREAM)
    assert stream.readline().startswith(b"data: ")
    rewrite_hardware(root, npu_runtime_errors={"1": 507035})
    events = sse_events(stream)
    assert json.loads(events[-2])["error"]["message"] == DEAD and events[-1] == "[DONE]"
    assert server.get("/health")[0] == 503
    assert server.post("/v1/completions", STREAM).status == 500
    assert exit_status(server) == 0
    log = server.output()
    # TP 2: the executor wraps the worker's error; the engine's ENGINE_CORE_DEAD leaves the monitor silent
    assert "EngineCore encountered a fatal error." in log
    assert ("RuntimeError: Worker failed with error 'ACL stream synchronize failed, error code:507035', "
            "please check the stack trace above for the root cause") in log
    assert "died unexpectedly" not in log


def test_an_npu_runtime_error_waits_for_a_step_on_one_of_the_instances_npus(start, tmp_path):
    root = node_root(tmp_path / "idle")
    server = start(env=NO_WATCHDOG, root=root)
    server.health_statuses()
    rewrite_hardware(root, npu_runtime_errors={"3": 507035})  # not one of this instance's NPUs (0, 1)
    assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 4}).status == 200
    rewrite_hardware(root, npu_runtime_errors={"0": 507015})
    time.sleep(0.5)
    assert server.get("/health")[0] == 200  # idle: no step has run on it yet
    reply = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 100, "ignore_eos": True})
    assert reply.status == 500 and json.loads(reply.read())["error"]["message"] == DEAD
    assert exit_status(server) == 0
    assert "error code:507015" in server.output()
