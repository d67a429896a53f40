"""Preflight's platform gate: a node whose glibc, arch or Python no wheel of a pin is built for is
refused in one line, from the index's own file list (here PyPI's real vllm-ascend 0.23.0 names)."""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.facts.ascend import Glibc
from ascend_fleet.fleet.profile_check import Indexes, Platform
from ascend_fleet.fleet.stack_platform import platform_problem, uncovered_pins

# https://pypi.org/simple/vllm-ascend/, 2026-12-01: 0.23.0's wheels, all manylinux_2_34.
VLLM_ASCEND_0_23_0 = [f"vllm_ascend-0.23.0-cp3{m}-cp3{m}-manylinux_2_34_{arch}.whl"
                      for m in (10, 11, 12) for arch in ("x86_64", "aarch64")] + ["vllm_ascend-0.23.0.tar.gz"]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> str:
    """A PEP 503 index listing vllm-ascend 0.23.0's files and nothing else."""
    root = tmp_path_factory.mktemp("index")
    page = root / "simple" / "vllm-ascend"
    page.mkdir(parents=True)
    (page / "index.html").write_text("".join(f'<a href="/files/{name}">{name}</a>\n' for name in VLLM_ASCEND_0_23_0))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple"
    server.shutdown()


@pytest.fixture
def profile():
    return load_profile("vllm-ascend-0.23.0")


def test_a_glibc_older_than_the_wheels_manylinux_tag_is_refused_naming_pin_platform_and_tags(profile, index):
    (problem,) = uncovered_pins(profile, Platform("x86_64", "3.11", "2.28"), index, Indexes())
    assert problem.startswith("vllm-ascend==0.23.0 has no wheel for x86_64 Python 3.11 glibc 2.28: ")
    assert "manylinux_2_34_x86_64 (cp310, cp311, cp312)" in problem


def test_a_python_no_wheel_is_built_for_is_refused_too(profile, index):
    (problem,) = uncovered_pins(profile, Platform("aarch64", "3.13", "2.39"), index, Indexes())
    assert "no wheel for aarch64 Python 3.13 glibc 2.39" in problem


def test_a_node_the_wheels_cover_passes(profile, index):
    assert uncovered_pins(profile, Platform("aarch64", "3.11", "2.35"), index, Indexes()) == []
    assert platform_problem(profile, "x86_64", "2.36", index, Indexes()) is None


def test_the_one_line_says_what_to_do_and_a_pin_the_index_does_not_list_is_left_to_pip(profile, index):
    # Only vllm-ascend is on this index: vllm, torch and the rest are pip's (and profile check's) to judge.
    line = platform_problem(profile, "aarch64", "2.31", index, Indexes())
    assert line.startswith("vllm-ascend==0.23.0 has no wheel for aarch64 Python 3.11 glibc 2.31")
    assert line.endswith("`ascend-fleet profile check vllm-ascend-0.23.0 --arch aarch64 --glibc 2.31`)")
    assert "no glibc found" in platform_problem(profile, "x86_64", None, index, Indexes())


def test_an_index_that_does_not_answer_here_is_left_to_the_node(profile):
    assert uncovered_pins(profile, Platform("x86_64", "3.11", "2.17"), "http://127.0.0.1:9/simple", Indexes()) == []


@pytest.mark.parametrize("output, glibc", [(["glibc 2.36"], "2.36"), (["glibc 2.17"], "2.17"), ([], None),
                                           (["unknown"], None)])
def test_the_glibc_fact_reads_getconf(output, glibc):
    assert Glibc().process(output) == glibc


def test_the_fact_asks_getconf_and_reads_its_answer_here():
    answer = subprocess.run(["sh", "-c", Glibc().command()], capture_output=True, text=True).stdout.splitlines()
    assert Glibc().process(answer) is not None  # this machine runs a glibc, as the nodes do

