"""The simulated vLLM server started per test, on each release the sim tests compare (engine death,
shutdown): its stand-in wheels unpacked once per module, a tiny model, a node root per server."""

from __future__ import annotations

import os
import signal
import zipfile
from pathlib import Path

import pytest

from ascend_fleet.lab.processes import children
from ascend_fleet.lab.sim.wheels import build_standin_wheels
from tests.sim.test_sim_server import SimServer, make_node_root, write_model

STACKS = {
    "0.18.0": {"torch_npu": "2.9.0", "vllm_ascend": "0.18.0", "vllm": "0.18.0"},
    "0.13.0": {"torch_npu": "2.8.0.post2", "vllm_ascend": "0.13.0", "vllm": "0.13.0"},
}
FAST = {"VLLM_SIM_LOAD_BASE_SECONDS": "0.2"}  # steps of 0.02 s (SimServer's VLLM_SIM_ITL_SECONDS)


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    """Each release's stand-in wheels unpacked into a directory of its own."""
    built = {}
    for version, stack in STACKS.items():
        site = built[version] = tmp_path_factory.mktemp(f"site-{version}")
        for wheel in build_standin_wheels(stack, tmp_path_factory.mktemp(f"wheels-{version}")):
            zipfile.ZipFile(wheel).extractall(site)
    return built


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "tiny")


def node_root(path: Path) -> Path:
    path.mkdir()
    return make_node_root(path)


@pytest.fixture
def start(sites, model_dir, tmp_path):
    """Starts a TP-2 server of a release, with extra options and environment, on a node root of its own
    (or the one given); kills what is left of every one at the end, engine cores included."""
    started: list[SimServer] = []

    def start_server(version: str = "0.18.0", options: tuple[str, ...] = (), env: dict | None = None,
                     root: Path | None = None) -> SimServer:
        root = root or node_root(tmp_path / f"node{len(started)}")
        server = SimServer(sites[version], root, tmp_path / f"server{len(started)}.log", "0,1",
                           [str(model_dir), "-tp", "2", *options], {**FAST, **(env or {})})
        started.append(server)
        return server

    yield start_server
    for server in started:
        for child in children(server.process.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.kill()
