"""The instance's vLLM command line: the Qwen3.5 recipes' options as vllm-ascend's guides pass them,
held against the pinned vLLM release's own option table, and written into the unit so that
systemd (its own parser, `systemd-analyze verify`) reads the same words back."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascend_fleet import TEMPLATES
from ascend_fleet.cli import build_app
from ascend_fleet.commands.plan_cli import layout
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import (
    SERVICE_ENV_FILE,
    instance_env_file,
    instance_home,
    instance_state_directory,
    instance_unit,
)
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.plan import check_fleet, fleet_node_configs, load_inventory, plan_fleet
from ascend_fleet.fleet.vllm_serve import OPTIONS_DIR, check_extra_args, check_serving_rules, check_vllm_args, vllm_args
from ascend_fleet.sizing.planner import ERROR, Finding
from tests.unit.test_fleet import FLEET, MODELS, prod_inventory, write_fleet

# The Qwen3.5-35B-A3B W8A8 recipe of vllm-ascend's Atlas A2 guide, as serving data.
RECIPE = ('"quantization": "ascend", "quantization_scheme": "w8a8", "enable_expert_parallel": True, '
          '"enable_prefix_caching": False, "async_scheduling": True, '
          '"speculative_config": {"method": "qwen3_5_mtp", "num_speculative_tokens": 1}, '
          '"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}')
SPECULATIVE = '{"method":"qwen3_5_mtp","num_speculative_tokens":1}'


def config_of(tmp_path: Path, profile: str, serving: str, model: str = "Qwen3.5-35B-A3B"):
    inventory = load_inventory(write_fleet(tmp_path, FLEET.format(profile=profile, model=model, serving=serving)),
                               tmp_path)
    return inventory, next(c for c in fleet_node_configs(inventory) if c.is_worker)


def vllm_of(config) -> str:
    """The vLLM release of the config's profile, as the planner and the serving stage pass it."""
    return load_profile(config.profile).stack.vllm


def test_the_recipe_reaches_vllm_as_its_options(tmp_path):
    _, config = config_of(tmp_path, "vllm-ascend-0.18.0", RECIPE)
    args = vllm_args(config, config.instances[0], "/mnt/nvme/models/x", vllm_of(config))
    line = " ".join(args)
    for expected in ("--quantization ascend", "--enable-expert-parallel", "--no-enable-prefix-caching",
                     "--async-scheduling", f"--speculative-config {SPECULATIVE}",
                     '--compilation-config {"cudagraph_mode":"FULL_DECODE_ONLY"}'):
        assert expected in line, line
    assert check_vllm_args(args, "0.18.0") == []


def test_an_instance_from_0_18_drains_at_sigterm_and_older_releases_get_no_such_option(tmp_path):
    """vLLM 0.18.0's --shutdown-timeout defaults to 0, which aborts the requests in flight when the unit stops."""
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    _, config = config_of(tmp_path / "new", "vllm-ascend-0.18.0", RECIPE)
    args = vllm_args(config, config.instances[0], "/mnt/nvme/models/x", vllm_of(config))
    assert args[args.index("--shutdown-timeout") + 1] == "110"
    assert check_vllm_args(args, "0.18.0") == []
    _, config = config_of(tmp_path / "old", "vllm-ascend-0.11.0", "\"enable_prefix_caching\": True")
    assert "--shutdown-timeout" not in vllm_args(config, config.instances[0], "/mnt/nvme/models/x", vllm_of(config))


def test_the_scheme_names_are_not_vllm_quantization_methods(tmp_path):
    """Issue 13: `w8a8` was passed as --quantization, which vLLM rejects; the method is `ascend`."""
    with pytest.raises(FleetError, match=r"serving.quantization: Input should be 'ascend'"):
        config_of(tmp_path, "vllm-ascend-0.18.0", '"quantization": "w8a8"')
    (tmp_path / "scheme").mkdir()
    with pytest.raises(FleetError, match="quantization_scheme w8a8 .* is for quantization: ascend; set that too"):
        config_of(tmp_path / "scheme", "vllm-ascend-0.18.0", '"quantization_scheme": "w8a8"')


def test_options_the_pinned_vllm_does_not_have_are_refused_before_any_host_changes(tmp_path):
    # vLLM 0.13.0's --mamba-ssm-cache-dtype takes auto, float16, float32 (bfloat16 from 0.23.0 on).
    inventory, _ = config_of(tmp_path, "vllm-ascend-0.23.0", '"mamba_ssm_cache_dtype": "bfloat16", '
                                                             '"extra_args": ["--no-such-option"]', "Qwen3.5-27B")
    with pytest.raises(FleetError, match=r"^node1 instance vllm-0: vLLM 0.23.0 has no option --no-such-option; "):
        check_fleet(inventory, MODELS / "qwen3.5-27b")
    args = ["--mamba-ssm-cache-dtype", "bfloat16", "--max_model_len", "4096"]
    assert [f.message for f in check_vllm_args(args, "0.13.0")] == [
        "vLLM 0.13.0 --mamba-ssm-cache-dtype takes one of auto, float16, float32, not bfloat16"]
    assert check_vllm_args(args, "0.23.0") == []
    assert check_vllm_args(["--max-model-len", "1"], "0.32.0+cpu") == []  # a +cpu build: its release's table
    assert [f.code for f in check_vllm_args([], "0.7.3")] == ["vllm-options-unknown"]


# Each as vLLM 0.18.0's `vllm serve` parser reads it (vllm_options/0.18.0.json, from the wheel).
EXTRA_ARGS_REFUSED = {
    "short option for TP": (["-tp", "4"], "serving.extra_args: -tp sets tensor_parallel_size, which ascend-fleet sets "
                            "from tensor_parallel_size; set it there, not in extra_args"),
    "the instance's port": (["--port", "9000"], "serving.extra_args: --port sets port, which ascend-fleet sets from "
                            "instance_ports.api or instances; set it there, not in extra_args"),
    "a serving key": (["--max-num-seqs=64"], "serving.extra_args: --max-num-seqs=64 sets max_num_seqs, which "
                      "ascend-fleet sets from serving.max_num_seqs; set it there, not in extra_args"),
    "the API key": (["--api-key", "k"], "serving.extra_args: --api-key sets api_key, which ascend-fleet sets from the "
                    "gateway's API key (docs/guides/secrets.md); set it there, not in extra_args"),
    "a lone ;": ([";"], "serving.extra_args: ';' is neither an option of vLLM 0.18.0 nor the value of the option "
                 "before it; remove it"),
    "a second value": (["--seed", "1", "2"], "serving.extra_args: '2' is neither an option"),
    "multi-node by hand": (["--headless"], "serving.extra_args: --headless sets headless, which ascend-fleet sets from "
                           "data_parallel;"),
    "an option given twice": (["--seed", "1", "--seed=2"], "serving.extra_args: --seed=2 sets seed, which --seed before "
                              "it sets too; vLLM keeps only the last: give it once"),
    "a key of a JSON option given twice": (["--kv-transfer-config", '{"kv_role": "kv_both"}',
                                            "--kv-transfer-config.kv_role", "kv_producer"],
                                           "serving.extra_args: --kv-transfer-config.kv_role sets "
                                           "kv_transfer_config.kv_role, which --kv-transfer-config before it sets too"),
}


@pytest.mark.parametrize("extra, refusal", EXTRA_ARGS_REFUSED.values(), ids=EXTRA_ARGS_REFUSED.keys())
def test_extra_args_are_options_of_the_pinned_vllm_that_the_tool_does_not_set(tmp_path, extra, refusal):
    _, config = config_of(tmp_path, "vllm-ascend-0.18.0", RECIPE + ', "max_num_seqs": 32')
    tool = vllm_args(config, config.instances[0], "MODEL", vllm_of(config))
    assert [f.message for f in check_extra_args(tool, extra, "0.18.0")][0].startswith(refusal)


def test_short_options_and_values_are_read_as_vllm_reads_them():
    assert [f.message for f in check_vllm_args(["-tp", "four"], "0.18.0")] == [
        "vLLM 0.18.0 -tp takes an integer, not 'four'"]
    assert [f.message for f in check_vllm_args(["--seed", ";"], "0.18.0")] == [
        "vLLM 0.18.0 --seed takes an integer, not ';'"]
    assert [f.message for f in check_vllm_args(["-x"], "0.18.0")] == [
        "vLLM 0.18.0 has no option -x; remove it from the serving data (or extra_args)"]
    assert check_vllm_args(["--seed", "-1", "--trust-remote-code", "--cudagraph-capture-sizes", "1", "2", "4"],
                           "0.18.0") == []
    assert check_extra_args(["MODEL", "--port", "8000"], ["--trust-remote-code", "--seed", "1024"], "0.18.0") == []


# extra_args values as vLLM 0.18.0's argparse types them (the option table's type), and the JSON of a
# dict-valued option as its config class does.
EXTRA_VALUES_REFUSED = {
    "each value of a list option": (["--cudagraph-capture-sizes", "1", "two"],
                                    "vLLM 0.18.0 --cudagraph-capture-sizes takes an integer or None, not 'two'"),
    "a human-readable int": (["--max-num-batched-tokens", "8q"], "vLLM 0.18.0 --max-num-batched-tokens takes an "
                             "integer (e.g. 32768, 32k or 32K), not '8q'"),
    "JSON that does not parse": (["--kv-transfer-config", "{kv_role: kv_both}"], "vLLM 0.18.0 --kv-transfer-config: "
                                 "'{kv_role: kv_both}' is not JSON"),
    "a key its class does not have": (["--kv-transfer-config", '{"kv_rol": "kv_both"}'], "vLLM 0.18.0 "
                                      "--kv-transfer-config: kv_rol: vLLM 0.18.0's KVTransferConfig has no key 'kv_rol' "
                                      "(vLLM refuses to start with it); did you mean kv_role?"),
    "a dotted key's value": (["--kv-transfer-config.kv_role=kv_middle"], "vLLM 0.18.0 "
                             "--kv-transfer-config.kv_role=kv_middle: kv_role: 'kv_middle' (a string): vLLM 0.18.0's "
                             "KVTransferConfig.kv_role (KVRole | None) takes one of kv_producer, kv_both, kv_consumer"),
    "nan for a float (argparse's float() takes it)": (["--mm-processor-cache-gb", "nan"], "vLLM 0.18.0 "
                                                      "--mm-processor-cache-gb takes a finite number, not 'nan'"),
    "inf for an optional float": (["--kv-offloading-size=inf"], "vLLM 0.18.0 --kv-offloading-size takes a finite "
                                  "number or None, not 'inf'"),
}


@pytest.mark.parametrize("args, refusal", EXTRA_VALUES_REFUSED.values(), ids=EXTRA_VALUES_REFUSED.keys())
def test_extra_args_values_are_typed_as_vllms_parser_types_them(args, refusal):
    assert [f.message for f in check_vllm_args(args, "0.18.0")][0].startswith(refusal)


def test_extra_args_values_vllm_takes_pass():
    assert check_vllm_args(["--max-num-batched-tokens", "32k", "--max-model-len", "1K", "--seed", "None",
                            "--kv-transfer-config.kv_role", "kv_both", "--kv-transfer-config.kv_connector=x"],
                           "0.18.0") == [Finding(ERROR, "vllm-option-value", "vLLM 0.18.0 --seed takes an integer, "
                                                 "not 'None'")]
    assert check_extra_args(["MODEL"], ["--kv-transfer-config.kv_role", "kv_both", "--kv-transfer-config.kv_connector",
                                        "x", "--middleware", "a", "--middleware", "b"], "0.18.0") == []


# What vLLM refuses at start-up across keys (vllm/config/scheduler.py and speculative.py of each release).
SERVING_REFUSED = {
    "batch below the context without chunked prefill": (
        '"enable_chunked_prefill": False, "max_num_batched_tokens": 2048', "serving.max_num_batched_tokens 2048 is "
        "below max_model_len 32768 with enable_chunked_prefill False: vLLM refuses to start"),
    "batch below the seats": ('"max_num_batched_tokens": 64, "max_num_seqs": 128', "serving.max_num_batched_tokens 64 "
                              "is below max_num_seqs 128: vLLM refuses to start; raise it or lower max_num_seqs"),
}


@pytest.mark.parametrize("serving, refusal", SERVING_REFUSED.values(), ids=SERVING_REFUSED.keys())
def test_serving_keys_vllm_refuses_together_are_refused_before_any_host_changes(tmp_path, serving, refusal):
    inventory, config = config_of(tmp_path, "vllm-ascend-0.18.0", serving, "Qwen3.5-27B")
    assert [f.message for f in check_serving_rules(config.serving, "0.18.0")][0].startswith(refusal)
    with pytest.raises(FleetError, match=r"^node1 instance vllm-0: " + re.escape(refusal)):
        check_fleet(inventory, MODELS / "qwen3.5-27b")


# Keys inside the dict-valued serving options, each as the pinned vLLM's config class types it
# (vllm_options/<version>.json config_classes, read from the release's wheel: vllm/config/*.py).
CONFIG_KEYS_REFUSED = {
    "a string where vLLM wants an int": (
        "vllm-ascend-0.18.0", '"speculative_config": {"method": "qwen3_5_mtp", "num_speculative_tokens": "1"}',
        "node1: serving.speculative_config.num_speculative_tokens: '1' (a string): vLLM 0.18.0's "
        "SpeculativeConfig.num_speculative_tokens (int) takes an integer"),
    "a misspelt key, the nearest suggested": (
        "vllm-ascend-0.18.0", '"compilation_config": {"cudagraph_mod": "FULL_DECODE_ONLY"}',
        "node1: serving.compilation_config.cudagraph_mod: vLLM 0.18.0's CompilationConfig has no key 'cudagraph_mod' "
        "(vLLM refuses to start with it); did you mean cudagraph_mode?"),
    "a mode vLLM does not have": (
        "vllm-ascend-0.18.0", '"compilation_config": {"cudagraph_mode": "FULL_DECODE"}',
        "node1: serving.compilation_config.cudagraph_mode: 'FULL_DECODE' (a string): vLLM 0.18.0's "
        "CompilationConfig.cudagraph_mode (CUDAGraphMode) takes one of NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, "
        "FULL_AND_PIECEWISE"),
    "a speculative method of a later release (qwen3_5_mtp came with 0.17)": (
        "vllm-ascend-0.13.0", '"speculative_config": {"method": "qwen3_5_mtp", "num_speculative_tokens": 1}',
        "node1: serving.speculative_config.method: 'qwen3_5_mtp' (a string): vLLM 0.13.0's SpeculativeConfig.method "
        "(SpeculativeMethod | None) takes one of ngram, "),
    "a key of a nested class": (
        "vllm-ascend-0.18.0", '"compilation_config": {"pass_config": {"fuse_norm_quant": "yes"}}',
        "node1: serving.compilation_config.pass_config.fuse_norm_quant: 'yes' (a string): vLLM 0.18.0's "
        "PassConfig.fuse_norm_quant (bool) takes true or false"),
    "a bound the class declares": (
        "vllm-ascend-0.18.0", '"speculative_config": {"method": "ngram", "num_speculative_tokens": 0}',
        "node1: serving.speculative_config.num_speculative_tokens: 0: vLLM 0.18.0 takes a value above 0 there"),
    "a key an older release ignores": (
        "vllm-ascend-0.11.0", '"compilation_config": {"mode": 3}',
        "node1: serving.compilation_config.mode: vLLM 0.11.0's CompilationConfig has no key 'mode' (vLLM ignores it, "
        "so the setting would do nothing); its keys: backend, "),
    "a Python set (was a traceback)": (
        "vllm-ascend-0.18.0", '"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "x": {1, 2}}',
        "node1: serving.speculative_config: x: {1, 2} is a Python set, which JSON cannot hold; write a list [...]"),
    "a non-JSON value in vllm-ascend's additional_config": (
        "vllm-ascend-0.18.0", '"additional_config": {"pa_shape_list": {8, 16}}',
        "node1: serving.additional_config: pa_shape_list: {8, 16} is a Python set, which JSON cannot hold"),
}


@pytest.mark.parametrize("profile, serving, refusal", CONFIG_KEYS_REFUSED.values(), ids=CONFIG_KEYS_REFUSED.keys())
def test_keys_of_dict_valued_options_are_typed_as_the_pinned_vllm_types_them(tmp_path, profile, serving, refusal):
    with pytest.raises(FleetError) as refused:
        config_of(tmp_path, profile, serving)
    message = str(refused.value)
    assert message.startswith(refusal) and "\n" not in message, message


def test_the_recipes_dict_valued_options_pass_as_each_release_types_them(tmp_path):
    # Enum members by name in any case (CompilationConfig's validators upper() them) or by value.
    _, config = config_of(tmp_path, "vllm-ascend-0.18.0", RECIPE.replace(
        '{"cudagraph_mode": "FULL_DECODE_ONLY"}', '{"cudagraph_mode": "full_decode_only", "mode": 3, '
        '"cudagraph_capture_sizes": [1, 2, 4], "pass_config": {"fuse_norm_quant": True}}'))
    assert config.serving.compilation_config["mode"] == 3
    for version in ("0.11.0", "0.13.0", "0.18.0", "0.23.0", "0.32.0"):
        data = json.loads((OPTIONS_DIR / f"{version}.json").read_text())["config_classes"]
        assert {"speculative_config", "compilation_config"} <= set(data["options"]), version
        assert data["source"]["wheel"].startswith(f"vllm-{version}") and len(data["source"]["sha256"]) == 64


def test_the_prod_recipe_serves_tool_calls_and_reasoning_with_parsers_its_vllm_has():
    """Issue 28: the official client's tools with tool_choice "auto" got 400 from every instance."""
    config = next(c for c in fleet_node_configs(prod_inventory()) if c.is_worker)
    args = vllm_args(config, config.instances[0], "/mnt/nvme/models/x", vllm_of(config))
    line = " ".join(args)
    for expected in ("--enable-auto-tool-choice", "--tool-call-parser qwen3_coder", "--reasoning-parser qwen3"):
        assert expected in line, line
    assert check_vllm_args(args, "0.18.0") == []


TOOLS = '"enable_auto_tool_choice": True, "tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3"'


@pytest.mark.parametrize("serving, refusal", [
    (TOOLS.replace("qwen3_coder", "qwen3-coder"), "serving.tool_call_parser: qwen3-coder is not a tool-call parser of "
     "vLLM 0.18.0; set one of deepseek_v3, deepseek_v31, "),
    (TOOLS.replace('"qwen3"', '"qwen3_5"'), "serving.reasoning_parser: qwen3_5 is not a reasoning parser of vLLM "
     "0.18.0; set one of deepseek_r1, deepseek_v3, "),
])
def test_a_parser_name_the_pinned_vllm_does_not_have_is_refused_before_any_host_changes(tmp_path, serving, refusal):
    inventory, _ = config_of(tmp_path, "vllm-ascend-0.18.0", serving, "Qwen3.5-27B")
    with pytest.raises(FleetError, match=r"^node1 instance vllm-0: ") as refused:
        check_fleet(inventory, MODELS / "qwen3.5-27b")
    message = str(refused.value)
    assert refusal in message and "qwen3" in message.split("set one of ")[1] and "\n" not in message, message


def test_parser_names_are_those_of_the_pinned_release():
    # glm47 came with vLLM 0.18.0 (vllm_options/*.json, from each release's registry).
    assert [f.message for f in check_vllm_args(["--tool-call-parser", "glm47"], "0.13.0")] == [
        "serving.tool_call_parser: glm47 is not a tool-call parser of vLLM 0.13.0; set one of "
        + ", ".join(json.loads((OPTIONS_DIR / "0.13.0.json").read_text())["tool_call_parsers"])]
    assert check_vllm_args(["--tool-call-parser", "glm47"], "0.18.0") == []
    # A plugin file registers names of its own: they are not checked.
    assert check_vllm_args(["--tool-parser-plugin", "/srv/mine.py", "--tool-call-parser", "mine"], "0.18.0") == []


def test_auto_tool_choice_and_its_parser_come_together(tmp_path):
    """vLLM refuses to start with --enable-auto-tool-choice alone, and with --tool-call-parser alone
    makes no tool parser (tool_choice "auto" still 400): both refused when the data is read."""
    with pytest.raises(FleetError, match=r"^node1: serving: enable_auto_tool_choice without tool_call_parser: vLLM "
                                         r"refuses to start .*; set tool_call_parser to the model's parser"):
        config_of(tmp_path, "vllm-ascend-0.18.0", '"enable_auto_tool_choice": True')
    (tmp_path / "parser").mkdir()
    with pytest.raises(FleetError, match=r"^node1: serving: tool_call_parser qwen3_coder without "
                                         r"enable_auto_tool_choice: .* 400; set enable_auto_tool_choice: True too"):
        config_of(tmp_path / "parser", "vllm-ascend-0.18.0", '"tool_call_parser": "qwen3_coder"')


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_reads_the_json_options_back_as_one_word_each(tmp_path):
    hostile = '"--a", ";", "--b", "it\'s \\"q\\" ; x", '
    _, config = config_of(tmp_path, "vllm-ascend-0.18.0",
                          RECIPE + f', "extra_args": [{hostile}"--chat-template-content-format", "100%$x"]')
    instance = config.instances[0]
    unit = tmp_path / instance_unit(instance.name)
    venv = tmp_path / "venv"  # systemd-analyze verify wants the ExecStart program to exist
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").symlink_to("/bin/true")
    unit.write_text(render(TEMPLATES / "vllm-instance.service.j2", instance=instance, model_id="m", revision="r",
                           service_user="root", helper="/bin/true", venv=venv,
                           weights_marker="/mnt/nv me/%h/.x",
                           args=vllm_args(config, instance, "/mnt/nvme/models/x", vllm_of(config)),
                           service_env_file=SERVICE_ENV_FILE, env_file=instance_env_file(instance.name),
                           home=instance_home(instance.name), state_directory=instance_state_directory(instance.name),
                           start_timeout=60, stop_timeout=30, start_limit_burst=3, start_limit_interval=300,
                           serves_http=True, leave_seconds=4))
    clean = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert (clean.returncode, clean.stdout, clean.stderr) == (0, "", "")
    # systemd's debug dump of the line it parsed: each JSON option one word (it prints quotes escaped),
    # % taken as written and $ kept for its variable expansion at exec time ($$ gives $).
    dumped = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            env={"SYSTEMD_LOG_LEVEL": "debug", "PATH": "/usr/bin:/bin"})
    parsed = re.search(r"Command Line: (\S+/bin/vllm serve .+)", dumped.stdout + dumped.stderr)[1]
    # the weights marker's path, with a space and a systemd specifier in it, is one word, % as written
    check = re.search(r"Command Line: (/bin/true check .+)", dumped.stdout + dumped.stderr)[1]
    assert check.endswith(' "/mnt/nv me/%h/.x"'), check
    assert ' --speculative-config "{\\"method\\":\\"qwen3_5_mtp\\",\\"num_speculative_tokens\\":1}" ' in parsed, parsed
    assert ' --compilation-config "{\\"cudagraph_mode\\":\\"FULL_DECODE_ONLY\\"}" ' in parsed, parsed
    assert parsed.endswith(' --chat-template-content-format "100%\\$\\$x"'), parsed
    # a lone ; is a word, not systemd's command separator; quotes inside a word stay in it
    assert ' --a ";" --b "it\'s \\"q\\" ; x" ' in parsed, parsed


def test_expert_parallel_in_the_data_is_in_the_plan(tmp_path):
    """With enable_expert_parallel the node's plan counts the EP all-to-all communicator's HCCL
    buffers (2 x HCCL_BUFFSIZE per NPU), as vLLM then opens it; before, the plan left EP out."""
    def hccl_reserve(serving: str, directory: Path) -> int:
        directory.mkdir()
        inventory, _ = config_of(directory, "vllm-ascend-0.18.0", serving, "Qwen3.5-122B-A10B")
        report = plan_fleet(inventory, MODELS / "qwen3.5-122b-a10b").instances[0]
        assert report.plan.ep == ("True" in serving)
        return report.plan.hccl_reserve_bytes_per_npu
    buffsize = 200 * 1024 * 1024  # group_data/all.py's HCCL_BUFFSIZE, in bytes
    assert hccl_reserve('"enable_expert_parallel": True', tmp_path / "ep") == \
        hccl_reserve('"enable_expert_parallel": False', tmp_path / "no-ep") + 2 * buffsize


def test_the_plan_of_the_recipe_shows_expert_parallel_and_the_mtp_draft(tmp_path, monkeypatch):
    inventory = write_fleet(tmp_path, FLEET.format(profile="vllm-ascend-0.18.0", model="Qwen3.5-122B-A10B", serving=RECIPE))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(build_app(), ["plan", str(inventory), "--model-config", str(MODELS / "qwen3.5-122b-a10b"),
                                      "--json"])
    figures = json.loads(result.output)["instances"][0]["plan"]
    assert figures["ep"] is True and figures["mtp_weight_bytes_per_npu"] > 0, figures
    report = plan_fleet(load_inventory(inventory, tmp_path), MODELS / "qwen3.5-122b-a10b").instances[0]
    assert layout(report.plan) == "TP4 + EP + MTP"  # the plan table's layout column


# vLLM's -O shorthand as FlexibleArgumentParser rewrites it before argparse (issue 49): from 0.13.0 -O<x>, -O=<x> and
# `-O <0-3>` are --optimization-level, typed by VllmConfig's OptimizationLevel (0-3); in 0.11.0 -O is
# --compilation-config's own flag and -O<x> is its level. Before, each shorthand was "no option -O3".
O_SHORTHAND_TAKEN = {"0.18.0": [["-O3"], ["-O", "0"], ["-O=2"], ["--optimization-level", "1"], ["-cc.mode", "3"]],
                     "0.11.0": [["-O3"], ["-O", "3"], ["-O=1"], ["-O.level", "2"]]}


@pytest.mark.parametrize("version, args", [(v, a) for v, cases in O_SHORTHAND_TAKEN.items() for a in cases],
                         ids=[f"{v} {' '.join(a)}" for v, cases in O_SHORTHAND_TAKEN.items() for a in cases])
def test_the_o_shorthand_vllm_takes_passes(version, args):
    assert check_vllm_args(args, version) == []


O_SHORTHAND_REFUSED = {
    "a level vLLM does not have": (["-O4"], "0.18.0", "vLLM 0.18.0 -O4 (vLLM reads --optimization-level): '4': vLLM "
                                   "0.18.0's VllmConfig.optimization_level takes one of 0, 1, 2, 3"),
    "a word for a level": (["-Odecode"], "0.18.0", "vLLM 0.18.0 -Odecode (vLLM reads --optimization-level): 'decode':"),
    "the long form out of range": (["--optimization-level", "5"], "0.18.0", "vLLM 0.18.0 --optimization-level: '5': "
                                   "vLLM 0.18.0's VllmConfig.optimization_level takes one of 0, 1, 2, 3"),
    "0.11.0's dotted form on 0.18.0 (a level '.mode=3' there)": (
        ["-O.mode=3"], "0.18.0", "vLLM 0.18.0 -O.mode=3 (vLLM reads --optimization-level): '.mode=3':"),
    "-O before a word that is no level": (["-O", "x"], "0.18.0", "vLLM 0.18.0 has no option -O;"),
    "0.11.0: a word as the compilation level": (
        ["-Odecode"], "0.11.0", "vLLM 0.11.0 -Odecode (vLLM reads -O.level=decode): level: 'decode' (a string): vLLM "
        "0.11.0's CompilationConfig.level (Optional[int]) takes an integer or null"),
}


@pytest.mark.parametrize("args, version, refusal", O_SHORTHAND_REFUSED.values(), ids=O_SHORTHAND_REFUSED.keys())
def test_the_o_shorthand_is_typed_as_vllm_types_it(args, version, refusal):
    assert [f.message for f in check_vllm_args(args, version)][0].startswith(refusal)


O_GIVEN_TWICE = {
    "shorthand and long form": (["-O3", "--optimization-level", "2"], "0.18.0", "serving.extra_args: "
                                "--optimization-level sets optimization_level, which -O3 (vLLM reads "
                                "--optimization-level) before it sets too; vLLM keeps only the last: give it once"),
    "two shorthands": (["-O3", "-O", "2"], "0.18.0", "serving.extra_args: -O (vLLM reads --optimization-level) sets "
                       "optimization_level, which -O3 (vLLM reads --optimization-level) before it sets too"),
    "0.11.0: shorthand and the whole compilation config": (
        ["-O3", "--compilation-config", '{"level": 3}'], "0.11.0", "serving.extra_args: --compilation-config sets "
        "compilation_config, which -O3 (vLLM reads -O.level=3) before it sets too"),
    "0.11.0: dotted level and shorthand": (
        ["--compilation-config.level", "3", "-O2"], "0.11.0", "serving.extra_args: -O2 (vLLM reads -O.level=2) sets "
        "compilation_config.level, which --compilation-config.level before it sets too"),
}


@pytest.mark.parametrize("extra, version, refusal", O_GIVEN_TWICE.values(), ids=O_GIVEN_TWICE.keys())
def test_an_option_given_twice_through_the_o_shorthand_and_its_long_form_is_refused(extra, version, refusal):
    assert [f.message for f in check_extra_args(["MODEL"], extra, version)][0].startswith(refusal)
