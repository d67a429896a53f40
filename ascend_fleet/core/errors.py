"""The one error type operators see, printed by the CLI and pyinfra as one line, and how a
pydantic ValidationError becomes that line."""

from __future__ import annotations

import difflib
import reprlib
import unicodedata
from typing import get_args

import pyinfra
from pydantic import BaseModel, ValidationError
from pyinfra.api.exceptions import PyinfraError

# Past this many, a validation error says how many more there are: a file that is wrong
# throughout (another format, a wrong indent) is one line, not a screenful.
SHOWN_PROBLEMS = 3

# pyinfra's CLI prints a CliError as `pyinfra error: <message>`, and any other PyinfraError raised
# while a deploy file runs as `pyinfra error in <file> line <n>: <message>`, the line of ours that
# raised it, which says nothing about the input. So inside pyinfra's CLI (`is_cli`, set before any
# inventory or deploy code is loaded) a FleetError is a CliError too. Not elsewhere: importing
# pyinfra_cli gevent-patches the standard library, too late in our own processes (see
# tests/conftest.py), and typer would catch a click exception a command raises.
if pyinfra.is_cli:
    from pyinfra_cli.exceptions import CliError

    _BASES: tuple[type[Exception], ...] = (PyinfraError, CliError)
else:
    _BASES = (PyinfraError,)


class FleetError(*_BASES):
    """A failure the operator can act on: the message names what, where, and what to do.

    A PyinfraError, so raised while pyinfra prepares a deploy it stops the run before any
    host is changed and prints `pyinfra error: <message>`, not a traceback; `ascend-fleet`
    prints it as `error: <message>`.
    """


class InputError(FleetError):
    """A refusal of what the operator typed (an option's value, a name, a file given): exit 2, as click's
    usage mistakes, before anything connects or changes."""

    exit_code = 2


def visible(value: object) -> str:
    """A value as a message quotes it, so that what the eye cannot tell apart shows: as is when it is
    printable ASCII without blanks at either end; else quoted with each other character escaped, and named:
    `'Qwen/Qwen3\\u201032B' (U+2010 HYPHEN)`, `'main ' (a trailing blank)`. A lookalike or a stray blank
    otherwise reads as the right name in "no such ..." (the path printed looks like the one meant)."""
    text = str(value)
    if not text:
        return "'' (empty)"
    notes = [f"U+{ord(char):04X}" + (f" {unicodedata.name(char)}" if unicodedata.name(char, "") else "")
             for char in dict.fromkeys(text) if not " " <= char <= "~"]
    if text[:1] == " ":
        notes.append("a leading blank")
    if text[-1:] == " ":
        notes.append("a trailing blank")
    return f"{ascii(text)} ({', '.join(notes)})" if notes else text


def describe_unreadable(exc: Exception, model: type[BaseModel]) -> str:
    """Why a file could not be read as `model`: pydantic's errors as one line (describe_validation), else what
    the OS or the JSON parser said."""
    return describe_validation(exc, model) if isinstance(exc, ValidationError) else str(exc)


def describe_validation(exc: ValidationError, model: type[BaseModel], hidden: frozenset[str] = frozenset()) -> str:
    """pydantic's errors as one line, `key.path: what` each: unknown keys first (each with the
    known keys it is close to, or where else it is a key), then missing keys, then the rest.
    `hidden` keys of `model` are set by the program, not the data, and never suggested."""
    errors = sorted(exc.errors(), key=lambda error: {"extra_forbidden": 0, "missing": 1}.get(error["type"], 2))
    problems = [_problem(error, model, hidden) for error in errors[:SHOWN_PROBLEMS]]
    if len(errors) > SHOWN_PROBLEMS:
        problems.append(f"and {len(errors) - SHOWN_PROBLEMS} more")
    return "; ".join(problems)


def unknown_keys_without_match(exc: ValidationError, model: type[BaseModel],
                               hidden: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Each unknown key nothing is suggested for -> the keys valid where it stands."""
    return {_where(error["loc"]): _valid_keys(model, error["loc"][:-1], hidden) for error in exc.errors()
            if error["type"] == "extra_forbidden" and not _suggestions(model, error["loc"], hidden)}


def _valid_keys(model: type[BaseModel], loc: tuple, hidden: frozenset[str] = frozenset()) -> list[str]:
    """The keys of the model at `loc` (field names, list indexes, dict keys) inside `model`."""
    for part in loc:
        if isinstance(part, str) and part in model.model_fields:
            model = _model_in(model.model_fields[part].annotation) or model
        # else a list index or a dict key: the model stays that of the items
    return [key for key in model.model_fields if key not in hidden]


def _problem(error: dict, model: type[BaseModel], hidden: frozenset[str]) -> str:
    where = _where(error["loc"])
    if error["type"] == "extra_forbidden":
        suggestions = " or ".join(f"`{key}`" for key in _suggestions(model, error["loc"], hidden))
        return f"{where}: unknown key (did you mean {suggestions}?)" if suggestions else f"{where}: unknown key"
    if error["type"] == "missing":
        return f"{where}: missing"
    message = error["msg"].removeprefix("Value error, ")
    if isinstance(error["input"], dict):  # a check of the whole mapping: its keys are already named by `where`
        return f"{where}: {message}"
    given = error["input"]
    shown = visible(given) if isinstance(given, str) and visible(given) != given else reprlib.repr(given)
    return f"{where}: {message} (got {shown})"


def _suggestions(model: type[BaseModel], loc: tuple, hidden: frozenset[str]) -> list[str]:
    """The known keys close to an unknown one where it stands; else where else the same key is known."""
    key = str(loc[-1])
    close = difflib.get_close_matches(key, _valid_keys(model, loc[:-1], hidden), n=2)
    return close or [path for path, name in _key_paths(model) if name == key]


def _key_paths(model: type[BaseModel], prefix: str = ""):
    """(dotted path, key) of every key in `model` and the models inside it."""
    for name, field in model.model_fields.items():
        yield prefix + name, name
        inner = _model_in(field.annotation)
        if inner:
            yield from _key_paths(inner, f"{prefix}{name}.")


def _where(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "data"


def _model_in(annotation) -> type[BaseModel] | None:
    """The model a field holds, directly or inside Optional, list or dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_in, get_args(annotation))), None)
