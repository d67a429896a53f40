"""Hand-typed input a user can reach the tool with ends in one line naming the file (or option), the key and the
value, never a Python traceback: a broken config.json for `plan --model-config`, rich markup in a value, a bundle
manifest of the wrong shape, a result directory that is a file; and a value quoted in a message shows what the eye
cannot tell apart (a Unicode lookalike, a trailing blank)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascend_fleet import cli
from ascend_fleet.control.rollout import new_model_problem
from ascend_fleet.core.bundle_layout import MANIFEST, listed_sha256
from ascend_fleet.core.errors import FleetError, InputError, visible
from ascend_fleet.core.model_tree import MANIFEST_NAME
from ascend_fleet.fleet.bundle import coverage_refusal, given_weights_manifest, os_coverage_refusal, verify_bundle

PROJECT = Path(__file__).resolve().parents[2]
QWEN25_72B = PROJECT / "tests" / "fixtures" / "models" / "qwen2.5-72b-instruct" / "config.json"


def plan(*args: str):
    """`ascend-fleet plan ARGS` in this process: (the FleetError it ended with or None, its output)."""
    result = CliRunner().invoke(cli.build_app("plan"), ["plan", *args])
    if result.exception is not None and not isinstance(result.exception, FleetError):
        raise result.exception  # a traceback: the test fails with it
    return result.exception, result.output


BROKEN_CONFIGS = {
    "zero heads": ({"num_attention_heads": 0},
                   "config.json num_attention_heads: 0, expected a whole number of at least 1"),
    "null size": ({"hidden_size": None}, "config.json hidden_size: null, expected a whole number of at least 1"),
    "size as a string": ({"intermediate_size": "29568"},
                         'config.json intermediate_size: "29568", expected a whole number of at least 1'),
    "a fraction": ({"num_hidden_layers": 80.5},
                   "config.json num_hidden_layers: 80.5, expected a whole number of at least 1"),
    "true as a size": ({"vocab_size": True}, "config.json vocab_size: true, expected a whole number of at least 1"),
    "null kv heads": ({"num_key_value_heads": None}, None),  # HF reads null as absent: the attention heads
    "zero kv heads": ({"num_key_value_heads": 0},
                      "config.json num_key_value_heads: 0, expected a whole number of at least 1"),
    "max positions as a string": ({"max_position_embeddings": "32k"},
                                  'config.json max_position_embeddings: "32k", expected a whole number of at least 1'),
    "model_type a list": ({"model_type": ["qwen2"]}, 'config.json model_type: ["qwen2"], expected a name in quotes'),
    "text_config a string": ({"text_config": "qwen2"},
                             'config.json text_config: "qwen2", expected an object (the decoder\'s keys)'),
    "experts without their size": ({"num_experts": 64}, "config.json has 64 experts but no moe_intermediate_size"),
    "zero sparse step": ({"num_experts": 64, "moe_intermediate_size": 1408, "decoder_sparse_step": 0},
                         "config.json decoder_sparse_step: 0, expected a whole number of at least 1"),
    "layer_types a string": ({"layer_types": "full_attention"},
                             'config.json layer_types: "full_attention", expected a list of layer kinds'),
}


@pytest.mark.parametrize("change, refusal", BROKEN_CONFIGS.values(), ids=BROKEN_CONFIGS.keys())
def test_a_broken_config_json_for_plan_is_one_line_naming_file_key_and_value_exit_2(tmp_path, change, refusal):
    """Before: ZeroDivisionError, TypeError, KeyError tracebacks (and a string size multiplied into a plan)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(QWEN25_72B.read_text()), **change}))
    error, output = plan("--model-config", str(config), "--tp", "8")
    if refusal is None:
        assert error is None, error
        return
    assert str(error) == f"{config}: {refusal}; pass the model's own config.json"
    assert error.exit_code == 2 and "Traceback" not in output


@pytest.mark.parametrize("text, refusal", [
    ("{\"hidden_size\": 8192,", "cannot be read as JSON (Expecting property name enclosed in double quotes"),
    ("[1, 2]", "a JSON list, not the object a model's config.json is"),
], ids=["not JSON", "not an object"])
def test_a_config_json_that_is_no_object_is_one_line(tmp_path, text, refusal):
    config = tmp_path / "config.json"
    config.write_text(text)
    error, _ = plan("--model-config", str(tmp_path))
    assert str(error).startswith(f"{config}: {refusal}")


def test_a_config_json_of_bytes_that_are_not_utf8_is_one_line(tmp_path):
    """Before: UnicodeDecodeError, a traceback (it is no JSONDecodeError)."""
    config = tmp_path / "config.json"
    config.write_bytes(b"\xff\xfe{\x00}\x00")
    error, _ = plan("--model-config", str(config))
    assert str(error).startswith(f"{config}: cannot be read as JSON ('utf-8' codec can't decode byte 0xff")


def run_main(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """The console entry as a shell runs it: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["ascend-fleet", *argv])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


@pytest.mark.parametrize("value", ["[/]", "[bold]qwen[/bold]", "x[/red]"])
def test_markup_in_a_value_is_printed_as_typed_never_read(monkeypatch, capsys, tmp_path, value):
    """Before: `[/]` in a path, a host name or a model_type was read as rich markup: a MarkupError traceback
    ("closing tag '[/]' ... has nothing to close"), or the text silently styled and gone from the line."""
    code, out, err = run_main(monkeypatch, capsys, "plan", "--model-config", f"models/{value}")
    assert (code, out, err) == (1, "", f"error: models/{value}: no such file; pass --model-config a config.json or "
                                       "the model directory\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(QWEN25_72B.read_text()), "model_type": value}))
    code, out, err = run_main(monkeypatch, capsys, "plan", "--model-config", str(config), "--tp", "4")
    assert code == 0 and f" {value} │" in out and "Traceback" not in err, out + err


@pytest.mark.parametrize("manifest, why", [
    ("[]", "data: Input should be a valid dictionary or instance of Manifest (got [])"),
    ('{"files": ["locks/a.txt"]}', "files: Input should be a valid dictionary (got ['locks/a.txt'])"),
    ('{"files": {"locks/a.txt": 3}}', "files.locks/a.txt: Input should be a valid string (got 3)"),
    ('{"files": {}, "platforms": [{"profile": "p"}]}', "platforms.0.arch: missing; platforms.0.python: missing; platforms.0.lock: missing"),
    ('{"files": {}, "os": "debian"}', "os: Input should be a valid list (got 'debian')"),
    ('{"files": {', "Expecting property name enclosed in double quotes: line 1 column 12 (char 11)"),
], ids=["a list", "files a list", "a digest a number", "a platform without arch", "os a string", "cut short"])
def test_a_bundle_manifest_of_the_wrong_shape_is_one_line_naming_the_key(tmp_path, manifest, why):
    """Before: TypeError, KeyError or AttributeError tracebacks in `bundle verify`, the deploy's bundle checks
    and the site mirror stage, each of which read the manifest on its own."""
    (tmp_path / MANIFEST).write_text(manifest)
    line = f"bundle {tmp_path}: cannot read {MANIFEST} ({why}); make it again with `ascend-fleet bundle`"
    for read in (verify_bundle, lambda out: coverage_refusal(out, "p", "x86_64", "3.11"),
                 lambda out: os_coverage_refusal(out, None, "x86_64"), lambda out: listed_sha256(out, "x")):
        with pytest.raises(FleetError) as refused:
            read(tmp_path)
        assert str(refused.value) == line


def test_a_model_dirs_weights_manifest_of_the_wrong_shape_is_one_line(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"model_id": "Qwen/Qwen3-8B", "files": {"a": "ab" * 32}}))
    with pytest.raises(InputError) as refused:
        given_weights_manifest(tmp_path)
    assert str(refused.value).startswith(
        f"bundle: --model-dir {tmp_path}: cannot read {MANIFEST_NAME} (revision: missing; files.a: Input should be a "
        "valid dictionary or instance of WeightsFile (got 'abab")
    assert str(refused.value).endswith("')); make it with the weights' own files, or leave it out (the bundle makes one)")


def test_a_result_directory_that_is_a_file_is_one_line_exit_2_before_anything_runs(monkeypatch, capsys, tmp_path):
    """Before: FileExistsError, a traceback, after the benchmark's virtualenv was built (and for tune, under the
    fleet's lease)."""
    taken = tmp_path / "results"
    taken.write_text("")
    monkeypatch.chdir(PROJECT)
    for command in (["bench", "inventories/prod.py"],
                    ["tune", "inventories/prod.py", "--canary", "npu-01.example.internal", "--grid", "max_num_seqs=4"]):
        code, out, err = run_main(monkeypatch, capsys, *command, "--result-dir", str(taken))
        assert (code, out, err) == (2, "", f"error: --result-dir {taken}: a file, not a directory; give a directory "
                                           "(made if missing) for the results\n")


@pytest.mark.parametrize("value, shown", [
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
    ("Qwen/Qwen3\u20108B", "'Qwen/Qwen3\\u20108B' (U+2010 HYPHEN)"),
    ("Qw\u0435n/Qwen3-8B", "'Qw\\u0435n/Qwen3-8B' (U+0435 CYRILLIC SMALL LETTER IE)"),
    ("main ", "'main ' (a trailing blank)"),
    ("\tmain", "'\\tmain' (U+0009)"),
    ("main\u00a0", "'main\\xa0' (U+00A0 NO-BREAK SPACE)"),
    ("", "'' (empty)"),
], ids=["plain", "hyphen lookalike", "cyrillic e", "trailing blank", "tab", "no-break space", "empty"])
def test_a_quoted_value_shows_what_the_eye_cannot_tell_apart(value, shown):
    assert visible(value) == shown


def test_no_config_json_for_a_swap_shows_the_lookalike_and_the_trailing_blank(monkeypatch, tmp_path):
    """Before: `no config.json of Qwen/Qwen3‐8B@main  on this machine ...; put it at .../Qwen3‐8B/main /config.json`,
    which reads as the right path."""
    monkeypatch.setattr("ascend_fleet.control.rollout.MODELS_DIR", tmp_path)
    problem = new_model_problem({"id": "Qwen/Qwen3\u20108B", "revision": "main ", "source": "modelscope"})
    assert problem == (
        "no config.json of 'Qwen/Qwen3\\u20108B@main ' (U+2010 HYPHEN, a trailing blank) on this machine to plan the "
        f"swap with (source modelscope is read by the nodes only); put it at '{tmp_path}/Qwen/Qwen3\\u20108B/main "
        "/config.json' (U+2010 HYPHEN)")
