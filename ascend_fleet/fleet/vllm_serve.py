"""An instance's `vllm serve` command line, and the pinned vLLM release's own option table to hold it
against (vllm_options/<version>.json: every argparse action of that release's `vllm serve`,
extracted from the real wheel by vllm_options/extract.py).

Every instance starts with `vllm serve`, as vllm-ascend's guides do: in vLLM 0.18.0 only the
subcommand acts on --headless and --api-server-count (serve.py `cmd`); the module entry point
`python -m vllm.entrypoints.openai.api_server` parses both and ignores them, so a multi-node
member started that way is refused by its head. One entry point for all keeps single-node and
multi-node instances alike (for a single-node instance the two run the same `run_server`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache, lru_cache

from ascend_fleet.config.hostdata import Instance, NodeConfig, Serving
from ascend_fleet.config.vllm_config import OPTIONS_DIR, config_classes, release_data
from ascend_fleet.fleet.multi_node import DataParallelRole
from ascend_fleet.sizing.planner import ERROR, WARNING, Finding


def vllm_args(config: NodeConfig, instance: Instance, model_path: str, vllm_version: str,
              role: DataParallelRole | None = None) -> list[str]:
    """The `vllm serve` arguments for one instance (the model path first, as its positional model_tag),
    from the model and serving data and the profile's vLLM release (the caller's profile, read once a
    run); a multi-node instance's member adds its part (the head serves the API, the others run headless)."""
    serving, model = config.serving, config.model
    args = [model_path, "--served-model-name", model.served_model_name, "--host", "0.0.0.0",
            "--port", str(instance.port), "--tensor-parallel-size", str(config.tensor_parallel_size),
            *(role.vllm_args() if role else []),
            "--dtype", serving.dtype, "--max-model-len", str(serving.max_model_len),
            "--gpu-memory-utilization", str(serving.gpu_memory_utilization)]
    # vLLM's BooleanOptionalAction pairs: only --no-X turns off what vLLM turns on by default.
    switches = {"enable-prefix-caching": serving.enable_prefix_caching,
                "enable-chunked-prefill": serving.enable_chunked_prefill,
                "enable-expert-parallel": serving.enable_expert_parallel,
                "async-scheduling": serving.async_scheduling,
                "enable-auto-tool-choice": serving.enable_auto_tool_choice}
    args += [f"--{'' if on else 'no-'}{switch}" for switch, on in switches.items() if on is not None]
    options = {"--max-num-batched-tokens": serving.max_num_batched_tokens, "--max-num-seqs": serving.max_num_seqs,
               "--block-size": serving.block_size, "--quantization": serving.quantization,
               "--mamba-ssm-cache-dtype": serving.mamba_ssm_cache_dtype,
               "--tool-call-parser": serving.tool_call_parser, "--reasoning-parser": serving.reasoning_parser}
    # vLLM parses these as JSON; one word without spaces, so ps and the unit show it whole.
    options |= {option: json.dumps(value, separators=(",", ":"), sort_keys=True) if value is not None else None
                for option, value in {"--speculative-config": serving.speculative_config,
                                      "--compilation-config": serving.compilation_config,
                                      "--additional-config": serving.additional_config}.items()}
    for option, value in options.items():
        if value is not None:
            args += [option, str(value)]
    return args + shutdown_args(vllm_version) + serving.extra_args


SHUTDOWN_TIMEOUT = "--shutdown-timeout"
# How long a stopped instance lets its requests in flight finish; the unit's TimeoutStopSec is a little
# longer (stages/serving.py STOP_TIMEOUT_SECONDS).
SHUTDOWN_DRAIN_SECONDS = 110


def shutdown_args(vllm_version: str) -> list[str]:
    """`--shutdown-timeout` on a release that has it: from 0.18.0 its default, 0, aborts every request in
    flight at SIGTERM (v1/engine/core.py _handle_shutdown), so a routed restart would cut answers short;
    earlier releases have no such option (docs/sim-fidelity.md, Shutdown on SIGTERM)."""
    table = option_table(vllm_version)
    return [SHUTDOWN_TIMEOUT, str(SHUTDOWN_DRAIN_SECONDS)] if table and SHUTDOWN_TIMEOUT in table else []


@cache
def option_table(vllm_version: str) -> dict[str, dict] | None:
    """{flag: argparse action} of the release's `vllm serve` (what the unit runs), or None when no table
    was extracted for it. Built once per release: every host's options are checked against it, so it
    is shared; read it, never change it."""
    data = release_data(vllm_version)
    if data is None:
        return None
    return {flag: action for action in data["serve"]["actions"] for flag in action["flags"]}


def check_data_parallel_start(vllm_version: str) -> list[Finding]:
    """A multi-node instance starts only on a vLLM that can pick its DP master ports with VLLM_PORT set
    (every instance's): 0.11.0 and 0.13.0 add get_open_port() to a set until it holds five, and with
    VLLM_PORT set that is the same port every time (vllm_options' dp_master_ports: "repeat")."""
    data = release_data(vllm_version)
    if data is None or data.get("dp_master_ports") != "repeat":
        return []
    return [Finding(ERROR, "vllm-dp-master-ports", f"vLLM {vllm_version} never starts a multi-node instance with "
                    "VLLM_PORT set (it picks its DP master ports from VLLM_PORT in a loop that never ends); serve "
                    "data_parallel on a profile whose vLLM picks them upward from VLLM_PORT (vllm-ascend-0.18.0's)")]


# Options whose value must be a name in one of the release's parser registries (not argparse choices:
# its API server refuses other names at start-up), the registry's key in the extracted data, and the
# option that registers more names from a plugin file (then the name is not ours to check).
PARSER_OPTIONS = {"--tool-call-parser": ("tool_call_parsers", "tool-call", "--tool-parser-plugin"),
                  "--reasoning-parser": ("reasoning_parsers", "reasoning", "--reasoning-parser-plugin")}


def parser_name_finding(flag: str, value: str | None, args: tuple[str, ...], vllm_version: str) -> Finding | None:
    """A parser name the pinned release does not have, as the serving key, the value and the names it has."""
    registry, kind, plugin = PARSER_OPTIONS[flag]
    names = (release_data(vllm_version) or {}).get(registry)
    if names is None or value in names or any(arg.split("=", 1)[0] == plugin for arg in args):
        return None
    return Finding(ERROR, "vllm-parser-unknown", f"serving.{flag[2:].replace('-', '_')}: {value} is not a {kind} "
                   f"parser of vLLM {vllm_version}; set one of {', '.join(names)}")


def check_serving_rules(serving: Serving, vllm_version: str) -> list[Finding]:
    """What vLLM refuses at start-up across serving keys, as every release pinned checks it: the scheduler's
    batch against the context and the seats (SchedulerConfig, vllm/config/scheduler.py, 0.11.0 to 0.18.0). The
    keys inside the dict-valued options are typed when the data is read (hostdata, vllm_config.py)."""
    findings = []
    batched = serving.max_num_batched_tokens
    if batched is not None and serving.enable_chunked_prefill is False and batched < serving.max_model_len:
        findings.append(Finding(ERROR, "vllm-batch-below-context", f"serving.max_num_batched_tokens {batched} is below "
                                f"max_model_len {serving.max_model_len} with enable_chunked_prefill False: vLLM "
                                "refuses to start (no prompt longer than one batch could be scheduled); raise it, "
                                "lower max_model_len or turn chunked prefill on"))
    if batched is not None and serving.max_num_seqs is not None and batched < serving.max_num_seqs:
        findings.append(Finding(ERROR, "vllm-batch-below-seats", f"serving.max_num_batched_tokens {batched} is below "
                                f"max_num_seqs {serving.max_num_seqs}: vLLM refuses to start; raise it or lower "
                                "max_num_seqs"))
    return findings


# Options ascend-fleet sets from the data, by argparse dest, and where the data sets them. Any other option
# the tool passes (a serving key) is refused in extra_args too, by the key it comes from.
OWNED_OPTIONS = {
    "model_tag": "model.id (the unit passes the staged path)", "model": "model.id (the unit passes the staged path)",
    "served_model_name": "model.served_model_name", "host": "ascend-fleet (all addresses; the firewall stage "
    "limits who reaches them)", "port": "instance_ports.api or instances", "uds": "instance_ports.api or instances",
    "tensor_parallel_size": "tensor_parallel_size", "headless": "data_parallel",
    "api_server_count": "data_parallel.api_server_count", "api_key": "the gateway's API key (docs/guides/secrets.md)",
    **{dest: "data_parallel" for dest in ("data_parallel_size", "data_parallel_size_local", "data_parallel_address",
                                          "data_parallel_rpc_port", "data_parallel_start_rank", "data_parallel_rank",
                                          "data_parallel_backend", "data_parallel_hybrid_lb",
                                          "data_parallel_external_lb", "nnodes", "node_rank")},
}
# Action kinds that take no value.
NO_VALUE_KINDS = {"store_true", "store_false", "store_const", "count", "help", "version", "boolean_optional"}


def _flag(word: str) -> str | None:
    """The option a command-line word names (FlexibleArgumentParser takes --max_model_len for
    --max-model-len, and --compilation-config.mode for a key of --compilation-config), or None for a value
    (a negative number included)."""
    if not word.startswith("-") or word[1:2].isdigit() or word == "-":
        return None
    flag = word.split("=", 1)[0].split(".", 1)[0]
    return flag.replace("_", "-") if flag.startswith("--") else flag


@dataclass(frozen=True)
class ParsedWord:
    """One command-line word as argparse reads it: an option (its action, {} for an unknown one, and its
    value) or a word that is neither an option nor the value of the one before it (action None). A key of a
    dict-valued option given on its own (--compilation-config.mode 3) has its key path."""

    word: str
    action: dict | None
    values: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    typed: str = ""  # the word as given, where FlexibleArgumentParser rewrote it (-O3)

    @property
    def value(self) -> str | None:
        """The option's value words as one, or None when it has none."""
        return " ".join(self.values) if self.values else None

    @property
    def flag(self) -> str | None:
        return _flag(self.word)

    @property
    def shown(self) -> str:
        """The word as the data gives it, and what vLLM reads it as where that differs."""
        return f"{self.typed} (vLLM reads {self.word})" if self.typed and self.typed != self.word else self.word

    @property
    def named(self) -> str | None:
        """The option as messages name it: its flag, with the shorthand it was given as."""
        return f"{self.typed} ({self.flag})" if self.typed and self.typed != self.word else self.flag


OPTIMIZATION_LEVEL = "--optimization-level"
# What `-O <level>` takes as its value (a word after it of other text is no shorthand).
O_LEVELS = {"0", "1", "2", "3"}


def _flexible(args: list[str], table: dict[str, dict]) -> list[tuple[str, str]]:
    """(word as argparse gets it, word as given) for each word, after FlexibleArgumentParser's -O shorthand.
    Releases with --optimization-level (0.13.0 to 0.32.0, vllm/utils/argparse_utils.py parse_args) make -O<x>
    and -O=<x> `--optimization-level <x>` (-O.mode=3 too: a level '.mode=3'), and `-O <0-3>` the same; 0.11.0
    (vllm/utils/__init__.py), where -O is --compilation-config's own flag, makes -O<x> `-O.level=<x>` unless x
    starts with '.', and `-O <0-3>` `-O.level <0-3>`."""
    levels = OPTIMIZATION_LEVEL in table
    words: list[tuple[str, str]] = []
    for index, word in enumerate(args):
        level = word[3:] if word[2:3] == "=" else word[2:]
        if word.startswith("-O") and word != "-O" and (levels or "-O" in table and word[2] != "."):
            words += [(OPTIMIZATION_LEVEL, word), (level, word)] if levels else [(f"-O.level={level}", word)]
        elif word == "-O" and args[index + 1:index + 2] and args[index + 1] in O_LEVELS and (levels or "-O" in table):
            words.append((OPTIMIZATION_LEVEL if levels else "-O.level", word))
        else:
            words.append((word, word))
    return words


def _parsed(args: list[str], table: dict[str, dict]):
    """Each ParsedWord of `args` (the model path, first, included), read as FlexibleArgumentParser reads them."""
    pairs = _flexible(args, table)
    args = [word for word, _ in pairs]
    index = 0
    while index < len(args):
        word, typed = pairs[index]
        flag = _flag(word)
        if flag is None:
            yield ParsedWord(word, None, typed=typed)
            index += 1
            continue
        action = table.get(flag, {})
        name = word.split("=", 1)[0]
        keys = tuple(name.split(".")[1:]) if "." in name else ()
        values = []
        if "=" in word:
            values = [word.split("=", 1)[1]]
        elif action and (keys or action["kind"] not in NO_VALUE_KINDS):
            for next_word in args[index + 1:]:
                if _flag(next_word) is not None or (values and (keys or action["nargs"] in (None, "?"))):
                    break
                values.append(next_word)
            index += len(values)
        if keys and values:
            values = [json.dumps(_nested(keys, values[0]))]
        yield ParsedWord(word, action, tuple(values), keys, typed)
        index += 1


def _nested(keys: tuple[str, ...], text: str) -> dict:
    """The JSON object FlexibleArgumentParser makes of --option.a.b VALUE: the value read as JSON, else the
    string; a key ending in + takes a comma-separated list (argparse_utils.py, 0.18.0)."""
    if keys[-1].endswith("+"):
        keys, value = (*keys[:-1], keys[-1][:-1]), text.split(",")
    else:
        try:
            value = json.loads(text)
        except ValueError:
            value = text
    for key in reversed(keys):
        value = {key: value}
    return value


def check_vllm_args(args: list[str], vllm_version: str) -> list[Finding]:
    """Every option the command line passes exists in the pinned vLLM, with a value it accepts."""
    return list(_vllm_args_findings(tuple(args), vllm_version))


# A fleet's workers mostly pass the same command line: each one checked once per process, not once per host.
@lru_cache(maxsize=256)
def _vllm_args_findings(args: tuple[str, ...], vllm_version: str) -> tuple[Finding, ...]:
    table = option_table(vllm_version)
    if table is None:
        known = ", ".join(sorted(p.stem for p in OPTIONS_DIR.glob("*.json")))
        return (Finding(WARNING, "vllm-options-unknown", f"no option table for vLLM {vllm_version} (have {known}); "
                                 "the serving options are not checked against it"),)
    findings = []
    for parsed in _parsed(args, table):
        action, flag, value = parsed.action, parsed.named, parsed.value
        if action is None:
            continue
        if not action:
            findings.append(Finding(ERROR, "vllm-option-unknown", f"vLLM {vllm_version} has no option {flag}; "
                                    "remove it from the serving data (or extra_args)"))
        elif parsed.flag in PARSER_OPTIONS and (finding := parser_name_finding(parsed.flag, value, args, vllm_version)):
            findings.append(finding)
        elif action["choices"] and value not in [str(choice) for choice in action["choices"]]:
            findings.append(Finding(ERROR, "vllm-option-value", f"vLLM {vllm_version} {flag} takes one of "
                                    f"{', '.join(map(str, action['choices']))}, not {value}"))
        elif action["kind"] in NO_VALUE_KINDS and parsed.values and not parsed.keys:
            findings.append(Finding(ERROR, "vllm-option-value", f"vLLM {vllm_version} {flag} takes no value (argparse "
                                    f"refuses {parsed.shown}: 'ignored explicit argument'); give {flag} alone"))
        elif action["kind"] not in NO_VALUE_KINDS and action["nargs"] != "?" and value is None:
            findings.append(Finding(ERROR, "vllm-option-value", f"vLLM {vllm_version} {flag} takes a value; give "
                                    "it one"))
        elif wrong := next((word for word in parsed.values if _type_problem(action["type"], word)), None):
            findings.append(Finding(ERROR, "vllm-option-value", f"vLLM {vllm_version} {flag} takes "
                                    f"{_type_problem(action['type'], wrong)}, not {wrong!r}"))
        elif value is not None and (problem := _config_problem(action["dest"], value, vllm_version)):
            findings.append(Finding(ERROR, "vllm-option-value", f"vLLM {vllm_version} {parsed.shown}: {problem}"))
        elif value is not None and (classes := config_classes(vllm_version)) and (
                problem := classes.setting_problem(action["dest"], value)):
            findings.append(Finding(ERROR, "vllm-option-value", f"vLLM {vllm_version} {parsed.shown}: {problem}"))
    return tuple(findings)


# argparse's type of an option (vllm_options' type tag: extract.py type_tag) and what it takes.
VALUE_TYPES = {"int": (int, "an integer"), "float": (float, "a number"), "human_int": (None, "an integer (e.g. 32768, "
               "32k or 32K)"), "optional_int": (int, "an integer or None"), "optional_float": (float, "a number or None")}
# vLLM's human_readable_int (vllm/engine/arg_utils.py, 0.18.0): a number with a decimal (k m g t) or binary
# (K M G T) suffix, decimals only with a decimal one, else a plain int.
HUMAN_INT = re.compile(r"\s*(\d+(\.\d+)?[kmgt]|\d+[KMGT]|[+-]?\d+)\s*")


def _type_problem(tag: str, value: str) -> str | None:
    """What argparse's type wants, when `value` is not it; None when it is (or the type is a string)."""
    if tag not in VALUE_TYPES:
        return None
    kind, expected = VALUE_TYPES[tag]
    if tag == "human_int":
        return None if HUMAN_INT.fullmatch(value) else expected
    if tag.startswith("optional_") and value in ("", "None"):
        return None
    try:
        number = kind(value)
    except ValueError:
        return expected
    # float() takes nan and inf as argparse does: no setting means either.
    return None if math.isfinite(number) else expected.replace("a number", "a finite number")


def _config_problem(dest: str, value: str, vllm_version: str) -> str | None:
    """A dict-valued option's JSON (from extra_args) as its config class types it: the first key it does
    not take, or JSON that does not parse."""
    classes = config_classes(vllm_version)
    if classes is None or dest not in classes.options or (dest == "speculative_config" and value in ("", "None")):
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"{value!r} is not JSON ({exc}); vLLM reads it as a JSON object of {classes.options[dest]}'s keys"
    if not isinstance(parsed, dict):
        return f"{value!r} is not a JSON object; vLLM reads it as one of {classes.options[dest]}'s keys"
    return next((f"{path}: {what}" for path, what in classes.problems(dest, parsed)), None)


def check_extra_args(tool_args: list[str], extra_args: list[str], vllm_version: str) -> list[Finding]:
    """serving.extra_args holds only options of the pinned vLLM and their values, none of which sets what
    the tool sets (the instance's port, model, TP size, a serving key; its value would depend on which
    of the two argparse reads last), nor any twice (vLLM keeps the last and only warns)."""
    return list(_extra_args_findings(tuple(tool_args), tuple(extra_args), vllm_version))


# Action kinds an option may be given more than once for, each adding to its value.
REPEATABLE_KINDS = {"append", "count"}


@lru_cache(maxsize=256)  # as _vllm_args_findings
def _extra_args_findings(tool_args: tuple[str, ...], extra_args: tuple[str, ...],
                         vllm_version: str) -> tuple[Finding, ...]:
    table = option_table(vllm_version)
    if table is None or not extra_args:
        return ()
    tool_dests = {parsed.action["dest"] for parsed in _parsed(tool_args, table) if parsed.action}
    findings = []
    given: dict[tuple, str] = {}
    for parsed in _parsed(extra_args, table):
        action, word = parsed.action, parsed.shown
        if action is None:
            findings.append(Finding(ERROR, "extra-arg-stray", f"serving.extra_args: {word!r} is neither an option of "
                                    f"vLLM {vllm_version} nor the value of the option before it; remove it"))
        elif action and (action["dest"] in OWNED_OPTIONS or action["dest"] in tool_dests):
            where = OWNED_OPTIONS.get(action["dest"]) or f"serving.{action['dest']}"
            findings.append(Finding(ERROR, "extra-arg-owned", f"serving.extra_args: {word} sets {action['dest']}, "
                                    f"which ascend-fleet sets from {where}; set it there, not in extra_args"))
        elif action and action["kind"] not in REPEATABLE_KINDS:
            # A dotted key (--compilation-config.mode) adds to its option's object; the whole object, or a key
            # given twice, vLLM replaces.
            key = (action["dest"], *parsed.keys)
            earlier = next((given[k] for k in given if k == key or (k[0] == key[0] and 1 in (len(k), len(key)))),
                           None)
            if earlier:
                findings.append(Finding(ERROR, "extra-arg-twice", f"serving.extra_args: {word} sets {'.'.join(key)}, "
                                        f"which {earlier} before it sets too; vLLM keeps only the last: give it once"))
            given[key] = word
    return tuple(findings)
