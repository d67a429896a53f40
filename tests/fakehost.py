"""A stand-in for the pyinfra host an operation runs on, for command-level tests: the node's state
as a table of fact answers, what the operation says through host.noop, and the commands it yields.

    fake = FakeHost({Sha256File: None, fact(File, path="/etc/x"): {"mode": 600, ...}})
    assert commands(private.private_file, fake, dest="/etc/x", content="...") == [...]
"""

from __future__ import annotations

import posixpath
from contextlib import contextmanager
from pathlib import Path

from pyinfra.api import Config, FileUploadCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File

from ascend_fleet.facts.files import FileState


def _hashable(value):
    # Fact arguments can be lists (SourcedEnvironment's scripts); keys must hash.
    return tuple(_hashable(item) for item in value) if isinstance(value, list) else value


def fact(fact_class, **arguments) -> tuple:
    """The key of a fact's answer for these arguments only (e.g. Sha256File of one path), beside a
    plain fact class key that answers for any arguments."""
    return fact_class, frozenset((name, _hashable(value)) for name, value in arguments.items())


def new_file(path: str) -> dict:
    """What placed.file and files.put read of a path nothing is at yet, in a directory that exists."""
    return {fact(FileState, path=path): None, fact(File, path=path): None, fact(Directory, path=path): None,
            fact(Directory, path=posixpath.dirname(path)): {"mode": 755, "user": "root", "group": "root"}}


class FakeState:
    """What operations and pyinfra's own (files.put) read of the run's state."""

    cwd = None

    def __init__(self, executing: bool):
        self.is_executing = executing
        self.config = Config()


class FakeHost:
    """A node as an operation sees it. `facts` maps a fact class, or fact(class, **arguments), to
    its answer; a fact not in the table raises KeyError, so a test never reads None by accident.
    `executing`: the deploy is running (False: pyinfra is preparing it, as for gates)."""

    def __init__(self, facts: dict | None = None, *, name: str = "worker1", executing: bool = True,
                 global_arguments: dict | None = None, temp_dir: str = "/tmp"):
        self.facts = dict(facts or {})
        self.name = name
        self.state = FakeState(executing)
        self.current_op_global_arguments = global_arguments
        self.temp_dir = temp_dir
        self.noops: list[str] = []

    @property
    def print_prefix(self) -> str:
        return f"[{self.name}] "

    def get_fact(self, fact_class, **arguments):
        for key in (fact(fact_class, **arguments), fact_class):
            if key in self.facts:
                return self.facts[key]
        shown = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
        raise KeyError(f"FakeHost has no answer for {fact_class.__name__}({shown})")

    def get_temp_filename(self, *_hash_key, temp_directory: str | None = None) -> str:
        return f"{temp_directory or self.temp_dir}/pyinfra-0123abcd"

    def noop(self, message: str) -> None:
        self.noops.append(message)


@contextmanager
def on(fake: FakeHost):
    """pyinfra's `host` and `state` are the fake's inside. Unlike ctx_host.use, put back when the
    operation raises too: a later test must not find this fake as its host."""
    hosts, states = ctx_host.get(), ctx_state.get()
    ctx_host.set(fake)
    ctx_state.set(fake.state)
    try:
        yield fake
    finally:
        ctx_host.set(hosts)
        ctx_state.set(states)


def commands(operation, fake: FakeHost, **arguments) -> list:
    """What the operation yields on this node, as it yields it (str, StringCommand, FileUploadCommand...)."""
    with on(fake):
        return list(operation._inner(**arguments))


def uploaded(upload: FileUploadCommand) -> bytes:
    """What an upload puts on the node, from a StringIO, a BytesIO or a file of the control machine."""
    if not hasattr(upload.src, "getvalue"):
        return Path(upload.src).read_bytes()
    content = upload.src.getvalue()
    return content.encode() if isinstance(content, str) else content


def uploads(steps: list) -> dict[str, bytes]:
    """The files the steps put on the node: their path there and their content."""
    return {step.dest: uploaded(step) for step in steps if isinstance(step, FileUploadCommand)}
