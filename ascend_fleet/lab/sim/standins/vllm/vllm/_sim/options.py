"""The pinned vLLM release's command line, rebuilt from the option data extracted from it.

options.json (written into the wheel by wheels.py from vllm_options/<version>.json)
lists every argparse action of `vllm serve` and of the api_server module, so the
simulated server accepts exactly that release's options and rejects the rest
with argparse's own errors.
"""

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

OPTIONS_FILE = Path(__file__).with_name("options.json")
HUMAN_SUFFIXES = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}


def load_option_data() -> dict:
    return json.loads(OPTIONS_FILE.read_text())


def human_int(value: str) -> int:
    """vLLM's human_readable_int: 32768, 32k (x1000) or 32K (x1024)."""
    if value and value[-1] in HUMAN_SUFFIXES:
        return int(float(value[:-1]) * HUMAN_SUFFIXES[value[-1]])
    return int(value)


def optional(convert: Callable[[str], object]) -> Callable[[str], object]:
    """vLLM's optional_type: "" and "None" mean None."""

    def convert_optional(value: str):
        return None if value in ("", "None") else convert(value)

    convert_optional.__name__ = convert.__name__  # argparse names the type in "invalid int value"
    return convert_optional


CONVERTERS = {
    "int": int,
    "float": float,
    "human_int": human_int,
    "optional_int": optional(int),
    "optional_float": optional(float),
    "str": None,
}


def dashed(arg: str) -> str:
    """FlexibleArgumentParser accepts --max_model_len for --max-model-len."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return name.replace("_", "-") + eq + value


class SimArgumentParser(argparse.ArgumentParser):
    """argparse with vLLM's underscore-or-dash option names."""

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):
        return super().parse_args([dashed(a) for a in args or []], namespace)


def _plain_flags(flags: list[str]) -> list[str]:
    """BooleanOptionalAction adds the --no- forms itself."""
    return [f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)]


def _add_action(parser: argparse.ArgumentParser, spec: dict) -> None:
    kind = spec["kind"]
    names = spec["flags"] or [spec["dest"]]
    common = {} if not spec["flags"] else {"dest": spec["dest"]}
    if kind in ("store", "append"):
        parser.add_argument(
            *names,
            **common,
            action=kind,
            nargs=spec["nargs"],
            type=CONVERTERS[spec["type"]],
            choices=spec["choices"],
            default=spec["default"],
        )
    elif kind == "boolean_optional":
        parser.add_argument(
            *_plain_flags(names), **common, action=argparse.BooleanOptionalAction, default=spec["default"]
        )
    elif kind == "store_const":
        parser.add_argument(*names, **common, action=kind, const=spec["const"], default=spec["default"])
    elif kind in ("store_true", "store_false", "count"):
        parser.add_argument(*names, **common, action=kind, default=spec["default"])
    elif kind == "help":
        parser.add_argument(*names, action="help")
    else:
        raise ValueError(f"option data has an action kind the simulator cannot rebuild: {kind}")


def build_parser(entry: str, data: dict | None = None) -> SimArgumentParser:
    """The parser of `entry` ("serve" or "api_server") for the pinned release."""
    spec = (data or load_option_data())[entry]
    parser = SimArgumentParser(
        prog=spec["prog"], usage=spec["usage"], allow_abbrev=spec["allow_abbrev"], add_help=False
    )
    for action in spec["actions"]:
        _add_action(parser, action)
    return parser
