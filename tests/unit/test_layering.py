"""The package's layers, read from its source (docs/architecture.md): the product never imports the
lab, facts never import operations, and every node path and unit name is spelled once, in
node_layout.py: the product and the tests take them from there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ascend_fleet
from ascend_fleet.core import node_layout

PACKAGE = Path(ascend_fleet.__file__).parent
TESTS = Path(__file__).resolve().parents[1]
# The product's modules: not the lab (which imports the product), not the node programs (shipped
# alone, they name what they write themselves), not the layout itself.
PRODUCT = sorted(p for p in PACKAGE.rglob("*.py")
                 if not p.is_relative_to(PACKAGE / "lab") and not p.is_relative_to(PACKAGE / "node")
                 and p != Path(node_layout.__file__))
# The tests: of the product (unit), on the lab (lab), of the simulator (sim) and what they share.
TEST_MODULES = sorted([*TESTS.glob("*.py"),
                       *(module for part in ("unit", "lab", "sim") for module in (TESTS / part).rglob("*.py"))])

# Every path the layout names, and the unit names (less .service) it gives units and instances.
LAYOUT_PATHS = sorted((value for name, value in vars(node_layout).items()
                       if name.isupper() and isinstance(value, str) and value.startswith("/")), key=len, reverse=True)
UNIT_NAMES = {value.removesuffix(".service") for name, value in vars(node_layout).items() if name.endswith("_UNIT")} | {
    node_layout.instance_unit("vllm").removesuffix(".service")}
# A layout path anywhere in a string (a command line too), with what follows it of the path.
LAYOUT_PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(map(re.escape, LAYOUT_PATHS))
                         + r")(?:/[^\s'\";|&<>(){}$`]*)?(?![\w.-])")
# Paths below a layout directory that are not ascend-fleet's on a node, each with why it is spelled.
NOT_NODE_PATHS = {
    "/var/lib/ascend-fleet/bench-venv": "the control machine's: bench.py's virtualenv for vllm bench",
    "/var/cache/ascend-fleet/bench": "the control machine's: bench.py's cache",
    "/etc/systemd/system/ascend-sim-driver.service": "the simulated vendor driver's unit, where Huawei's driver puts "
                                                     "its own (tests/sim and test_sim_platform.py check it is there)",
    "/etc/systemd/system/sysinit.target.wants/ascend-sim-driver.service": "the same unit's enablement",
    "/var/lib/ascend-sim": "the simulated driver's state directory (test_sim_platform.py resets a node to bare)",
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def strings_of(path: Path) -> list[tuple[int, str]]:
    """Every string constant but docstrings, with its line (f-strings' literal parts too)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_product_module_imports_the_lab():
    # cli.py mounts the lab's commands by the module's name, as a string, not by an import.
    offenders = {str(p.relative_to(PACKAGE)): sorted(n for n in imports_of(p) if n.startswith("ascend_fleet.lab"))
                 for p in PRODUCT}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_facts_never_import_operations():
    offenders = {str(p.relative_to(PACKAGE)): sorted(n for n in imports_of(p) if n.startswith("ascend_fleet.operations"))
                 for p in (PACKAGE / "facts").glob("*.py")}
    assert {path: names for path, names in offenders.items() if names} == {}


def node_path_spellings(modules: list[Path], root: Path) -> list[str]:
    """Each string of the modules that spells a layout path (or a path below one) or a unit name itself."""
    found = []
    for module in modules:
        for line, text in sorted(strings_of(module)):
            paths = [path for path in LAYOUT_PATH.findall(text) if path not in NOT_NODE_PATHS]
            units = [unit for unit in UNIT_NAMES if unit in text]
            if paths or units:
                found.append(f"{module.relative_to(root)}:{line}: {text!r}")
    return found


def test_every_node_path_is_spelled_in_the_layout_module_only():
    assert node_layout.GATEWAY_CONFIG in LAYOUT_PATHS and node_layout.SERVICE_HOME in LAYOUT_PATHS
    assert {node_layout.FIREWALL_UNIT.removesuffix(".service"), node_layout.NPU_METRICS_UNIT} <= UNIT_NAMES
    assert any(unit in node_layout.instance_unit("vllm-0-green") for unit in UNIT_NAMES)
    assert node_path_spellings(PRODUCT, PACKAGE) == []


def test_the_tests_take_node_paths_and_unit_names_from_the_layout_module_too():
    assert len(TEST_MODULES) > 50 and Path(__file__).resolve() in TEST_MODULES
    assert node_path_spellings(TEST_MODULES, TESTS) == []


def test_the_check_finds_a_node_path_or_unit_name_in_a_command_line(tmp_path):
    config_dir, firewall = node_layout.CONFIG_DIR, node_layout.FIREWALL_UNIT.removesuffix(".service")
    module = tmp_path / "test_planted.py"
    module.write_text(f"CAT = 'cat {config_dir}' + '/npu.env'\nBENCH = '/var/cache/ascend-fleet/bench'\n"
                      f"def f(lab):\n    lab.run('w', f'systemctl restart {firewall}; ls {{lab}}')\n"
                      f"    return 'tail {node_layout.NGINX_ERROR_LOG}', 'rm -rf {config_dir}-other /etc/default/x'\n")
    assert node_path_spellings([module], tmp_path) == [
        f"test_planted.py:1: 'cat {config_dir}'", f"test_planted.py:4: 'systemctl restart {firewall}; ls '",
        f"test_planted.py:5: 'tail {node_layout.NGINX_ERROR_LOG}'"]


def test_templates_get_the_node_paths_as_variables():
    ours = (node_layout.CONFIG_DIR, node_layout.PROGRAM_DIR, node_layout.SERVICE_HOME, node_layout.CACHE_DIR)
    templates = [t for t in (PACKAGE / "templates").rglob("*.j2") if "lab" not in t.relative_to(PACKAGE).parts]
    found = [f"{t.relative_to(PACKAGE)}: {path}" for t in templates for path in ours if path in t.read_text()]
    assert templates and found == []
