"""The programs shipped to nodes import with nothing but the standard library: a fresh node has no
site-packages of ours, and the system Python runs them."""

import subprocess
import sys
from pathlib import Path

import pytest

import ascend_fleet.node
from ascend_fleet.operations.weights import stager_archive

NODE_PROGRAMS = sorted(p for p in Path(ascend_fleet.node.__file__).parent.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("program", NODE_PROGRAMS, ids=lambda p: p.name)
def test_a_node_program_imports_with_the_standard_library_alone(program):
    # -I: no user site, no PYTHONPATH, no cwd on the path; -S: no site-packages at all.
    result = subprocess.run([sys.executable, "-I", "-S", "-c",
                             f"import runpy; runpy.run_path({str(program)!r}, run_name='imported')"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_weights_stager_archive_runs_with_the_standard_library_alone(tmp_path):
    archive = tmp_path / "stage_weights.pyz"
    archive.write_bytes(stager_archive())
    result = subprocess.run([sys.executable, "-I", "-S", str(archive), "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "--model-id" in result.stdout, result.stderr


def test_the_weights_stager_archive_is_the_same_bytes_every_time():
    # A rerun of the deploy compares it with the node's copy: a new timestamp would upload it again.
    first = stager_archive()
    stager_archive.cache_clear()
    assert stager_archive() == first
