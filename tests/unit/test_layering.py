"""The package's layers, read from its source (docs/architecture.md): the product never imports the
lab, facts never import operations, and every node path is spelled once, in node_layout.py."""

from __future__ import annotations

import ast
from pathlib import Path

import ascend_fleet
from ascend_fleet import node_layout

PACKAGE = Path(ascend_fleet.__file__).parent
# The product's modules: not the lab (which imports the product), not the node programs (shipped
# alone, they name what they write themselves), not the layout itself.
PRODUCT = sorted(p for p in PACKAGE.rglob("*.py")
                 if not p.is_relative_to(PACKAGE / "lab") and not p.is_relative_to(PACKAGE / "node")
                 and p != Path(node_layout.__file__))
# Paths on the control machine, not on a node, that share a prefix with the service's home.
CONTROL_MACHINE_PATHS = {"/var/lib/ascend-fleet/bench-venv", "/var/cache/ascend-fleet/bench"}


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


def test_every_node_path_is_spelled_in_the_layout_module_only():
    paths = {value for name, value in vars(node_layout).items() if name.isupper() and isinstance(value, str)
             and value.startswith("/")}
    assert node_layout.GATEWAY_CONFIG in paths and node_layout.SERVICE_HOME in paths
    found = []
    for module in PRODUCT:
        for line, text in strings_of(module):
            if text in CONTROL_MACHINE_PATHS:
                continue
            if any(text == path or text.startswith(f"{path}/") for path in paths) or "ascend-fleet-vllm" in text:
                found.append(f"{module.relative_to(PACKAGE)}:{line}: {text!r}")
    assert found == []


def test_templates_get_the_node_paths_as_variables():
    ours = (node_layout.CONFIG_DIR, node_layout.PROGRAM_DIR, node_layout.SERVICE_HOME, node_layout.CACHE_DIR)
    templates = [t for t in (PACKAGE / "templates").rglob("*.j2") if "lab" not in t.relative_to(PACKAGE).parts]
    found = [f"{t.relative_to(PACKAGE)}: {path}" for t in templates for path in ours if path in t.read_text()]
    assert templates and found == []
