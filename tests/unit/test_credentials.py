"""Credentials: where the control machine's tokens and API key come from, how they reach a node
(a root-only file, never a printed command) and how node-side probes send the key."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from pyinfra.api import FileUploadCommand, StringCommand

from ascend_fleet.config.credentials import SECRETS_FILE_VARIABLE, api_headers, control_credentials, env_lines
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import CONFIG_DIR, HUB_TOKENS_FILE, instance_home
from ascend_fleet.facts.ascend import HttpAnswer, HttpAnswers
from ascend_fleet.facts.files import FileState
from ascend_fleet.operations.private import private_file
from tests.fakehost import FakeHost
from tests.fakehost import commands as operation_commands

SECRET = "hf_0123456789abcdef"


def secrets_file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "secrets.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_environment_wins_over_the_secrets_file(tmp_path):
    path = secrets_file(tmp_path, "export HF_TOKEN='from-file'\nVLLM_API_KEY=file-key\nOTHER=ignored\n")
    environ = {SECRETS_FILE_VARIABLE: str(path), "VLLM_API_KEY": "env-key"}
    assert control_credentials(environ) == {"HF_TOKEN": "from-file", "VLLM_API_KEY": "env-key"}
    assert control_credentials({}) == {}


def test_a_secrets_file_others_can_read_is_refused_without_showing_it(tmp_path):
    path = secrets_file(tmp_path, f"HF_TOKEN={SECRET}\n", mode=0o644)
    with pytest.raises(FleetError, match="must be yours and private.*mode 0644.*chmod 600") as error:
        control_credentials({SECRETS_FILE_VARIABLE: str(path)})
    assert SECRET not in str(error.value)


def test_a_value_that_would_break_an_env_file_is_refused_by_name_only():
    with pytest.raises(FleetError, match="VLLM_API_KEY holds a blank") as error:
        control_credentials({"VLLM_API_KEY": "two words"})
    assert "two words" not in str(error.value)


def test_api_headers_carry_the_key_only_when_set(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv(SECRETS_FILE_VARIABLE, raising=False)
    assert api_headers() == {}
    monkeypatch.setenv("VLLM_API_KEY", "k-1")
    assert api_headers() == {"Authorization": "Bearer k-1"}


def node(file: dict | None, sha256: str | None = None, **options) -> FakeHost:
    """What private_file reads of a node: the file's owner, mode and sha256 (FileState)."""
    return FakeHost({FileState: file and {**file, "sha256": sha256}}, **options)


def commands(fake: FakeHost, content: str | None) -> list:
    return operation_commands(private_file, fake, dest=HUB_TOKENS_FILE, content=content)


def test_private_file_is_uploaded_into_a_0600_file_and_no_command_holds_its_text():
    steps = commands(node(None), env_lines({"HF_TOKEN": SECRET}))
    assert steps[:2] == [f"mkdir -p {CONFIG_DIR}", f"install -m 600 -o root -g root /dev/null {HUB_TOKENS_FILE}.new"]
    assert isinstance(steps[2], FileUploadCommand) and steps[2].dest == f"{HUB_TOKENS_FILE}.new"
    assert steps[3] == f"mv {HUB_TOKENS_FILE}.new {HUB_TOKENS_FILE}"
    assert not any(SECRET in str(step) for step in steps)


def test_under_sudo_the_login_users_upload_lands_in_a_file_it_made_0600_and_never_in_an_existing_one(tmp_path):
    steps = commands(node(None, global_arguments={"_sudo": True}, temp_dir=str(tmp_path)),
                     env_lines({"HF_TOKEN": SECRET}))
    create, upload = steps[2], steps[3]
    assert isinstance(create, StringCommand) and create.connector_arguments["_sudo"] is False
    assert isinstance(upload, FileUploadCommand) and upload.remote_temp_filename == f"{tmp_path}/pyinfra-0123abcd"
    subprocess.run(["sh", "-c", create.get_raw_value()], check=True)
    assert stat.S_IMODE(os.stat(upload.remote_temp_filename).st_mode) == 0o600
    # One left there by someone else (here: the first run's) is refused, not written into.
    assert subprocess.run(["sh", "-c", create.get_raw_value()], capture_output=True).returncode != 0
    assert not any(SECRET in str(step) for step in steps)


def test_private_file_is_left_alone_when_current_and_private_and_fixed_when_readable():
    content = env_lines({"HF_TOKEN": SECRET})
    digest = hashlib.sha256(content.encode()).hexdigest()
    private = {"mode": 600, "user": "root", "group": "root"}
    fake = node(private, digest)
    assert commands(fake, content) == [] and fake.noops
    assert len(commands(node({**private, "mode": 644}, digest), content)) == 4


def test_private_file_without_content_is_removed():
    assert commands(node({"mode": 600, "user": "root", "group": "root"}), None) == [
        f"rm -f {HUB_TOKENS_FILE}"]
    assert commands(node(None), None) == []


class RecordingHandler(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        RecordingHandler.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def log_message(self, *_args):
        pass


def test_http_answer_sends_the_key_of_the_env_file_without_it_on_a_command_line(tmp_path):
    key_file = tmp_path / "instance.env"
    key_file.write_text(f"HOME={instance_home('vllm-0')}\nVLLM_API_KEY={SECRET}\n")
    server = HTTPServer(("127.0.0.1", 0), RecordingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/models"
        fact = HttpAnswer()
        with_key = fact.command(url, timeout_seconds=5, api_key_file=str(key_file))
        without_key = fact.command(url, timeout_seconds=5)
        answers = [fact.process(subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                               check=True).stdout.splitlines())
                   for command in (with_key, without_key)]
    finally:
        server.shutdown()
    assert SECRET not in with_key
    assert [answer["status"] for answer in answers] == [200, 200]
    assert RecordingHandler.seen == [f"Bearer {SECRET}", None]


def test_http_answers_asks_each_request_in_one_command_and_answers_in_order(tmp_path):
    """A deploy's instance gate asks four things of an instance in one round trip; each answer is its
    own request's, the metrics' many lines included."""
    server = HTTPServer(("127.0.0.1", 0), RecordingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        fact = HttpAnswers()
        command = fact.command([{"url": f"{base}/v1/models", "timeout_seconds": 5},
                                {"url": "http://127.0.0.1:9/health", "timeout_seconds": 5}])
        answers = fact.process(subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                              check=True).stdout.splitlines())
    finally:
        server.shutdown()
    assert answers == [{"status": 200, "body": '{"data": []}'}, {"status": 0, "body": ""}]
