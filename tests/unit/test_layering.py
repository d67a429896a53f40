"""The package's layers, read from its source (docs/architecture.md): every module is in one layer (a
folder, or one of the few modules at the top) and imports only from its own and those below; the
product never imports the lab, facts never import operations, stages read the validated NodeConfig and
not raw host data, and every node path and unit name is spelled once, in node_layout.py: the product
and the tests take them from there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ascend_fleet
from ascend_fleet.config.hostdata import NodeConfig
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


# The package's layers, bottom up (docs/architecture.md): a module imports only from its own layer and those
# below it. "face" is ascend_fleet/__init__.py (where the package's data is), "entry" the modules at the top.
LAYERS = ["face", "node", "core", "sizing", "config", "facts", "operations", "fleet", "stages", "control",
          "commands", "entry", "lab"]
FOLDERS = [layer for layer in LAYERS if layer not in ("face", "entry")]
# The modules directly under ascend_fleet/, each with its layer (issue 50: at most 12 there).
TOP_MODULES = {"__init__": "face", "cli": "entry", "fleet_check": "entry"}


def module_name(path: Path, root: Path) -> str:
    """A file's dotted module name, root being the folder that holds the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Every name the module imports, as `module` and `module.name`; relative imports resolved."""
    tree = ast.parse(path.read_text())
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [node.module])]) \
                if node.level else node.module
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def layer_of(path: Path) -> str | None:
    """The layer of a module of the package (its path in the package), or None: in no layer."""
    if len(path.parts) == 1:
        return TOP_MODULES.get(path.stem)
    return path.parts[0] if path.parts[0] in FOLDERS else None


def layer_problems(package: Path) -> list[str]:
    """Each module in no layer and each import that runs from a layer up to a higher one, one line each."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        layer = layer_of(path.relative_to(package))
        if layer is None:
            problems.append(f"{path.relative_to(package)}: in no layer; put it in one of {', '.join(FOLDERS[:-1])}")
            continue
        for name in sorted(imports_of(path, package.parent)):
            first, _, rest = name.partition(".")
            if first != package.name:
                continue
            # a layer's folder or a top module; else a name of the package's face (TEMPLATES, PROJECT_ROOT...)
            top = rest.partition(".")[0]
            target = top if top in FOLDERS else TOP_MODULES.get(top, "face")
            if LAYERS.index(target) > LAYERS.index(layer):
                problems.append(f"{path.relative_to(package)} ({layer}) imports {name} ({target})")
    return problems


def test_every_module_is_in_one_layer_and_imports_only_its_own_and_those_below():
    assert len(list(PACKAGE.glob("*.py"))) <= 12
    assert layer_problems(PACKAGE) == []


def test_a_module_in_no_layer_or_an_import_up_a_layer_is_found(tmp_path):
    package = tmp_path / "ascend_fleet"
    for name, text in {"__init__.py": "", "cli.py": "from ascend_fleet.control import bench\n",
                       "helpers.py": "", "misc/thing.py": "", "core/__init__.py": "",
                       "core/errors.py": "from ascend_fleet import TEMPLATES\nfrom ascend_fleet.stages import full\n",
                       "sizing/planner.py": "from . import perfmodel\nfrom ..config import hostdata\n",
                       "control/bench.py": "from ascend_fleet.cli import main\nimport ascend_fleet.lab.cli\n"}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert layer_problems(package) == [
        "control/bench.py (control) imports ascend_fleet.cli (entry)",
        "control/bench.py (control) imports ascend_fleet.cli.main (entry)",
        "control/bench.py (control) imports ascend_fleet.lab.cli (lab)",
        "core/errors.py (core) imports ascend_fleet.stages (stages)",
        "core/errors.py (core) imports ascend_fleet.stages.full (stages)",
        "helpers.py: in no layer; put it in one of node, core, sizing, config, facts, operations, fleet, stages, "
        "control, commands",
        "misc/thing.py: in no layer; put it in one of node, core, sizing, config, facts, operations, fleet, stages, "
        "control, commands",
        "sizing/planner.py (sizing) imports ascend_fleet.config (config)",
        "sizing/planner.py (sizing) imports ascend_fleet.config.hostdata (config)"]


# Keys a stage may read from raw host data, each with why: NodeConfig (config/hostdata.py) does not hold them.
RAW_HOST_DATA = {"ssh_hostname": "pyinfra's connector setting (the address it connects to), which NodeConfig "
                                 "leaves to pyinfra: the firewall and the peers name a host by it"}


def raw_host_data_reads(modules: list[Path], root: Path) -> list[str]:
    """Each read of a host's raw data (`x.data.key`, `x.data.get("key")`, `x.data["key"]`, `x.data.dict()`)
    of a key not in RAW_HOST_DATA, one line each."""
    found = []
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "data":
                key = (node.args[0].value if node.func.attr == "get" and node.args
                       and isinstance(node.args[0], ast.Constant) else f"{node.func.attr}()")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "data" and node.attr not in ("get", "dict"):
                key = node.attr
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "data":
                key = node.slice.value if isinstance(node.slice, ast.Constant) else ast.unparse(node.slice)
            if key is not None and key not in RAW_HOST_DATA:
                found.append((str(module.relative_to(root)), node.lineno, key))
    return [f"{path}:{line}: {key}" for path, line, key in sorted(found)]


def test_stages_read_the_validated_node_config_not_raw_host_data():
    assert not set(RAW_HOST_DATA) & set(NodeConfig.model_fields)
    assert raw_host_data_reads(sorted((PACKAGE / "stages").glob("*.py")), PACKAGE) == []


def test_a_raw_read_of_a_key_node_config_holds_is_found(tmp_path):
    module = tmp_path / "stage.py"
    module.write_text("def f(host, member):\n    a = host.data.npu_count\n    b = host.data.get('profile')\n"
                      "    c = member.data.get('ssh_hostname') or member.data['bundle_dir']\n"
                      "    return host.data.dict(), host_node_config(host).npu_count\n")
    assert raw_host_data_reads([module], tmp_path) == [
        "stage.py:2: npu_count", "stage.py:3: profile", "stage.py:4: bundle_dir", "stage.py:5: dict()"]


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
