"""The NPU services' environment file, captured on the node from CANN's own set_env.sh."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from ascend_fleet import TEMPLATES
from ascend_fleet.core.templating import render
from ascend_fleet.facts.ascend import SourcedEnvironment
from ascend_fleet.operations import placed

# Variables holding path lists: CUDA entries in them would shadow or clash with CANN's libraries.
PATH_LISTS = {"PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "PYTHONPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"}
CUDA_VARIABLES = {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_VISIBLE_DEVICES"}


def without_cuda(variables: dict[str, str]) -> dict[str, str]:
    """Drop CUDA variables and every CUDA entry of a path list; NPU services must not load CUDA libraries."""
    clean = {}
    for name, value in variables.items():
        if name in CUDA_VARIABLES:
            continue
        if name in PATH_LISTS:
            value = ":".join(entry for entry in value.split(":") if entry and "cuda" not in entry.lower())
        clean[name] = value
    return clean


@operation()
def service_env_file(dest: str, env_scripts: list[str], venv: str, settings: dict[str, str]):
    """
    Write the environment file NPU services load: what sourcing env_scripts sets on this node
    (read when the deploy runs, after CANN and the Python stack are installed), CUDA removed,
    then settings.

    + dest: the file's path (systemd EnvironmentFile)
    + env_scripts: set_env.sh scripts to source, in order; missing ones are skipped
    + venv: the serving virtualenv, whose python3 the scripts see (ATB's C++ ABI is its torch's)
    + settings: further variables (HCCL, vllm-ascend), which win over captured ones
    """
    captured = without_cuda(host.get_fact(SourcedEnvironment, scripts=env_scripts, venv=venv))
    content = render(TEMPLATES / "npu.env.j2", captured={k: v for k, v in captured.items() if k not in settings},
                     settings=settings)
    yield from placed.file._inner(dest=dest, content=content, mode="644", user="root", group="root")
