"""The keys and values of a dict-valued vLLM option (--speculative-config, --compilation-config, ...) held
against the pinned release's own config class, as vllm_options/extract.py read it from the release's wheel
(vllm_options/<version>.json `config_classes`: each field's annotation as vllm/config/*.py writes it, the
Literals and enums those name).

vLLM builds the class from the option's JSON (pydantic: SpeculativeConfig(**value), CompilationConfig by
TypeAdapter.validate_json), so a misspelt key, a mode the release does not have or a string where it wants
an integer stops it at start-up, on every instance, after the deploy changed the node; from 0.18.0 its
config decorator forbids unknown keys, before it pydantic's dataclass ignores them (the setting silently
does nothing). Both are refused here, before any connection. What the data cannot tell is let through:
an annotation naming a type outside vllm/config (a quantization method's registry, a callable) is not
checked. An enum takes its member's name in any case (the classes' `mode="before"` validators upper() a
string) or its value."""

from __future__ import annotations

import ast
import json
import math
import re
from difflib import get_close_matches
from functools import cache
from pathlib import Path

from packaging.version import Version

OPTIONS_DIR = Path(__file__).with_name("vllm_options")

# Annotations whose value the checker reads as what they wrap.
WRAPPERS = {"Optional", "SkipValidation", "Annotated"}
SEQUENCES = {"list", "List", "Sequence", "tuple", "Tuple", "set", "Set", "frozenset"}
MAPPINGS = {"dict", "Dict", "Mapping"}
SCALARS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "Path": "a string"}
BOUNDS = {"ge": ("at least", lambda v, b: v >= b), "gt": ("above", lambda v, b: v > b),
          "le": ("at most", lambda v, b: v <= b), "lt": ("below", lambda v, b: v < b)}


def json_problem(value, path: str = "") -> str | None:
    """Where `value` holds something JSON cannot (a set, a tuple key, bytes, an object), named by its path,
    or None: vLLM reads a dict-valued option as JSON, and json.dumps of a set fails."""
    if isinstance(value, float) and not math.isfinite(value):
        return (f"{path or 'the option'}: {value} is no number JSON holds (Python's json writes NaN or Infinity, "
                "which vLLM would read as such); give a finite number")
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        return next((problem for i, item in enumerate(value) if (problem := json_problem(item, f"{path}[{i}]"))),
                    None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path or 'the option'} has the key {key!r} ({type(key).__name__}); JSON keys are strings: "
                        f"write {json.dumps(str(key))}")
            if problem := json_problem(item, f"{path}.{key}" if path else key):
                return problem
        return None
    kind = type(value).__name__
    remedy = "write a list [...]" if isinstance(value, (set, frozenset)) else "write a string, number, list or dict"
    return f"{path or 'the option'}: {value!r} is a Python {kind}, which JSON cannot hold; {remedy}"


class ConfigClasses:
    """One release's config classes (vllm_options/<version>.json `config_classes`)."""

    def __init__(self, version: str, data: dict):
        self.version = version
        self.options: dict[str, str] = data["options"]
        self.classes: dict[str, dict] = data["classes"]
        self.literals: dict[str, list] = data["literals"]
        self.enums: dict[str, dict] = data["enums"]
        self.refuses_unknown = data["unknown_keys"] == "refused"
        # Options that set a VllmConfig field of an enum (--optimization-level): argparse takes any string.
        self.settings: dict[str, str] = data.get("settings", {})

    def setting_problem(self, dest: str, text: str) -> str | None:
        """What VllmConfig refuses in an option's value (`settings`), as pydantic reads the string argparse
        passes (lax: digits are the number an IntEnum's member has), or None."""
        if dest not in self.settings:
            return None
        annotation = ast.parse(self.settings[dest], mode="eval").body
        value = int(text) if re.fullmatch(r"\s*[0-9]+\s*", text, re.ASCII) else text
        if self._accepts(annotation, value) is False:
            return f"{ascii(text)}: vLLM {self.version}'s VllmConfig.{dest} takes {self._describe_values(annotation)}"
        return None

    def _describe_values(self, node) -> str:
        """An enum as what a command line gives it: its values."""
        members = self.enums.get(_name(node))
        return f"one of {', '.join(map(str, members['values']))}" if members else self._describe(node)

    def problems(self, dest: str, value: dict) -> list[tuple[str, str]]:
        """(key path, what is wrong and what to do) for each key of the option `dest`'s JSON object that its
        class does not take as given; [] for an option without a config class."""
        name = self.options.get(dest)
        return self._class_problems(name, value, "") if name else []

    def _class_problems(self, name: str, value: dict, path: str) -> list[tuple[str, str]]:
        fields = self.classes[name]["fields"]
        problems = []
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key not in fields:
                close = get_close_matches(key, fields, n=1, cutoff=0.6)
                effect = ("refuses to start with it" if self.refuses_unknown else
                          "ignores it, so the setting would do nothing")
                remedy = f"did you mean {close[0]}?" if close else f"its keys: {', '.join(sorted(fields))}"
                problems.append((where, f"vLLM {self.version}'s {name} has no key {key!r} (vLLM {effect}); "
                                        f"{remedy}"))
                continue
            field = fields[key]
            annotation = ast.parse(field["type"], mode="eval").body
            problems += self._value_problems(annotation, item, where, f"{name}.{key} ({field['type']})", field)
        return problems

    def _value_problems(self, annotation, value, path: str, declared: str, field: dict) -> list[tuple[str, str]]:
        alternatives = self._alternatives(annotation)
        for alternative in alternatives:
            accepted = self._accepts(alternative, value)
            if accepted is None or accepted is True:
                return self._bound_problems(value, path, field)
            if isinstance(accepted, list):  # a config class's object: its own keys
                return self._class_problems(_name(alternative), value, path)
        expected = " or ".join(dict.fromkeys(self._describe(a) for a in alternatives))
        return [(path, f"{_shown(value)}: vLLM {self.version}'s {declared} takes {expected}")]

    def _bound_problems(self, value, path: str, field: dict) -> list[tuple[str, str]]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return []
        return [(path, f"{value}: vLLM {self.version} takes a value {words} {bound} there (it refuses {value} at "
                       "start-up)")
                for key, (words, holds) in BOUNDS.items() if (bound := field.get(key)) is not None
                and not holds(value, bound)]

    def _alternatives(self, node) -> list:
        """The types a value may have: unions, Optional and wrappers opened."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._alternatives(node.left) + self._alternatives(node.right)
        if isinstance(node, ast.Subscript) and _name(node.value) in WRAPPERS | {"Union"}:
            items = _items(node)
            if _name(node.value) == "Optional":
                return self._alternatives(items[0]) + [ast.Constant(None)]
            if _name(node.value) in WRAPPERS:
                return self._alternatives(items[0])
            return [alternative for item in items for alternative in self._alternatives(item)]
        return [node]

    def _accepts(self, node, value):
        """True, False, None (a type the data cannot check) or, for a config class, [] (its keys are checked)."""
        name = _name(node)
        if isinstance(node, ast.Constant):
            return value is None if node.value is None else None
        if name in SCALARS:
            if name == "float":
                return isinstance(value, (int, float)) and not isinstance(value, bool)
            if name == "int":
                return isinstance(value, int) and not isinstance(value, bool)
            return isinstance(value, {"bool": bool, "str": str, "Path": str}[name])
        if (values := self._literal(node)) is not None:
            return value in values
        if name in self.enums:
            members = self.enums[name]
            return ((isinstance(value, str) and value.upper() in members["names"]) or
                    (not isinstance(value, bool) and value in members["values"]))
        if name in self.classes:
            return [] if isinstance(value, dict) else False
        if isinstance(node, ast.Subscript) and _name(node.value) in SEQUENCES:
            if not isinstance(value, (list, tuple)):
                return False
            items = _items(node)
            if len(items) > 1 and not (len(items) == 2 and isinstance(items[1], ast.Constant)):
                return None  # a fixed tuple of kinds: not checked
            alternatives = self._alternatives(items[0])
            return all(any(self._accepts(a, item) in (True, None) for a in alternatives) for item in value)
        if name in MAPPINGS or (isinstance(node, ast.Subscript) and _name(node.value) in MAPPINGS):
            return isinstance(value, dict)
        return None

    def _literal(self, node) -> list | None:
        if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
            items = _items(node)
            values = []
            for item in items:
                values += [item.value] if isinstance(item, ast.Constant) else self.literals.get(_name(item), [])
            return values
        return self.literals.get(_name(node))

    def _describe(self, node) -> str:
        name = _name(node)
        if isinstance(node, ast.Constant) and node.value is None:
            return "null"
        if name in SCALARS:
            return SCALARS[name]
        if (values := self._literal(node)) is not None:
            return f"one of {', '.join(map(str, values))}"
        if name in self.enums:
            return f"one of {', '.join(self.enums[name]['names'])}"
        if name in self.classes:
            return f"an object of {name}'s keys"
        if isinstance(node, ast.Subscript) and _name(node.value) in SEQUENCES:
            items = _items(node)
            return f"a list of ({' or '.join(self._describe(a) for a in self._alternatives(items[0]))})"
        if name in MAPPINGS or (isinstance(node, ast.Subscript) and _name(node.value) in MAPPINGS):
            return "an object"
        return ast.unparse(node)


def _items(node: ast.Subscript) -> list:
    """What a subscripted annotation names inside its brackets: Union[a, b] -> [a, b], Optional[a] -> [a]."""
    return node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]


def _name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _shown(value) -> str:
    """The value as the data has it, its kind said where JSON would hide it ('1' is a string)."""
    if isinstance(value, str):
        return f"{ascii(value)} (a string)"
    return json.dumps(value) if isinstance(value, (dict, list, bool)) or value is None else repr(value)


def option_table_path(vllm_version: str) -> Path:
    """Where the option data of a vLLM release is kept; a +cpu build has its release's."""
    return OPTIONS_DIR / f"{Version(vllm_version).public}.json"


@cache
def release_data(vllm_version: str) -> dict | None:
    """What vllm_options/extract.py took from the release's wheel, or None when nothing was."""
    path = option_table_path(vllm_version)
    return json.loads(path.read_text()) if path.is_file() else None


@cache
def config_classes(vllm_version: str) -> ConfigClasses | None:
    """The release's config classes, or None when its option data has none."""
    data = (release_data(vllm_version) or {}).get("config_classes")
    return ConfigClasses(Version(vllm_version).public, data) if data else None


def serving_config_problems(options: dict[str, dict | None], vllm_version: str) -> list[tuple[str, str]]:
    """(key, what) for each key of the dict-valued serving options ({dest: value}) the pinned vLLM's config
    class does not take as given, the key as the data spells it (serving.compilation_config.mode). Hosts of
    one group share their options: each set is judged once (JSON keeps a string apart from a number)."""
    return list(_serving_config_problems(json.dumps(options), vllm_version))


@cache
def _serving_config_problems(options_json: str, vllm_version: str) -> tuple[tuple[str, str], ...]:
    options = json.loads(options_json)
    classes = config_classes(vllm_version)
    if classes is None:
        return ()
    return tuple((f"serving.{dest}.{path}", what) for dest, value in options.items() if value
                 for path, what in classes.problems(dest, value))
