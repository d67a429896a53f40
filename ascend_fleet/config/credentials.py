"""Credentials from the control machine: the hub tokens and the vLLM API key.

Each comes from the control machine's environment (MODELSCOPE_API_TOKEN, HF_TOKEN,
VLLM_API_KEY) or else from the file that ASCEND_FLEET_SECRETS_FILE names: KEY=VALUE lines,
owned by the user running the tool and readable by nobody else. They are never host data
(pyinfra prints that) and never part of a command line: the deploy renders them into
root-owned 0600 environment files on the nodes (operations/private.py), and the tools that
call the instances send the key as a Bearer header.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.templating import env_value

HUB_TOKEN_NAMES = ("MODELSCOPE_API_TOKEN", "HF_TOKEN")
API_KEY_NAME = "VLLM_API_KEY"
SECRETS_FILE_VARIABLE = "ASCEND_FLEET_SECRETS_FILE"
# Printable ASCII without blanks, quotes or backslashes: the value goes into env files and a curl config line as is.
PLAIN_VALUE = re.compile(r"[!#-&(-\[\]-~]+")


def secrets_file_values(path: Path) -> dict[str, str]:
    """The credential lines of a file only its owner (the user running this) can read."""
    try:
        info = path.stat()
        text = path.read_text()
    except OSError as exc:
        raise FleetError(f"control machine: {SECRETS_FILE_VARIABLE}={path}: cannot read it ({exc.strerror}): "
                         "point it at your secrets file or unset it") from None
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise FleetError(f"control machine: secrets file {path} must be yours and private (it is uid {info.st_uid}, "
                         f"mode {stat.S_IMODE(info.st_mode):04o}): chown it to yourself and chmod 600 it")
    values = {}
    for line in text.splitlines():
        name, sep, value = line.strip().removeprefix("export ").partition("=")
        value = value.strip()
        if sep and name.strip() in (*HUB_TOKEN_NAMES, API_KEY_NAME):
            values[name.strip()] = value[1:-1] if value[:1] in "'\"" and value[-1:] == value[:1] else value
    return values


def control_credentials(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """{name: value} of the credentials set: the environment first, then the secrets file."""
    path = environ.get(SECRETS_FILE_VARIABLE)
    from_file = secrets_file_values(Path(path)) if path else {}
    found = {name: environ.get(name) or from_file.get(name) for name in (*HUB_TOKEN_NAMES, API_KEY_NAME)}
    for name, value in found.items():
        if value and not PLAIN_VALUE.fullmatch(value):
            raise FleetError(f"control machine: {name} holds a blank, quote, backslash or non-ASCII character: "
                             "use a token of printable characters without them")
    return {name: value for name, value in found.items() if value}


def hub_tokens() -> dict[str, str]:
    return {name: value for name, value in control_credentials().items() if name in HUB_TOKEN_NAMES}


def api_key() -> str | None:
    return control_credentials().get(API_KEY_NAME)


def api_headers() -> dict[str, str]:
    """The request headers every call to an instance or the gateway carries: the API key when one is set."""
    key = api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def env_lines(values: Mapping[str, str]) -> str:
    """KEY=VALUE lines for an EnvironmentFile (systemd) or the weights stager's tokens file."""
    return "".join(f"{name}={env_value(value)}\n" for name, value in sorted(values.items()))
