"""The `ascend-fleet` command: everything pyinfra alone does not do well."""

import importlib
import logging
import sys
from importlib.metadata import version

import click
import typer
from rich.console import Console
from rich.markup import escape

from ascend_fleet.core.errors import FleetError

# Each command's module and how it joins the CLI: "group" (a sub-app under the command's name),
# "merged" (a sub-app whose commands join the top level), "command" (one function). Only the
# module of the command being run is imported: `ascend-fleet lab ssh` starts without pyinfra, the
# planner or the benchmark, a second of CPU less on every start.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "lab": ("ascend_fleet.lab.cli", "lab_app", "group"),
    "plan": ("ascend_fleet.commands.plan_cli", "plan", "command"),
    "check": ("ascend_fleet.fleet.check", "check", "command"),
    "rollout": ("ascend_fleet.commands.rollout_cli", "rollout_app", "merged"),
    "swap-model": ("ascend_fleet.commands.rollout_cli", "rollout_app", "merged"),
    "load": ("ascend_fleet.commands.rollout_cli", "rollout_app", "merged"),
    "drain": ("ascend_fleet.commands.drain_cli", "drain_app", "merged"),
    "undrain": ("ascend_fleet.commands.drain_cli", "drain_app", "merged"),
    "profile": ("ascend_fleet.commands.profile_cli", "profile_app", "group"),
    "bundle": ("ascend_fleet.commands.bundle_cli", "bundle", "command"),
    "status": ("ascend_fleet.control.status", "status", "command"),
    "bench": ("ascend_fleet.control.bench", "bench", "command"),
    "tune": ("ascend_fleet.control.tune", "tune", "command"),
}

err_console = Console(stderr=True)
# Usage errors: click's, and those of the copy of click typer carries from 0.26 on (typer._click),
# which click's own except clause does not catch.
USAGE_ERRORS = tuple({click.ClickException, *(kind for kind in typer.BadParameter.__mro__
                                             if kind.__name__ == "ClickException")})


def _print_version(asked: bool) -> None:
    if asked:
        print(f"ascend-fleet {version('ascend-fleet')}")
        raise typer.Exit()


def build_app(command: str | None = None) -> typer.Typer:
    """The CLI: only `command`'s module when it names one of COMMANDS, else every command (help)."""
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

    # a group even with one command, so the command's name stays in argv
    @app.callback()
    def _top(show_version: bool = typer.Option(False, "--version", is_eager=True, help="print the version and exit",
                                               callback=_print_version)) -> None:
        del show_version  # _print_version acts on it

    joined = set()
    for name in [command] if command in COMMANDS else COMMANDS:
        module, attribute, how = COMMANDS[name]
        if (module, attribute) in joined:
            continue
        joined.add((module, attribute))
        target = getattr(importlib.import_module(module), attribute)
        if how == "group":
            app.add_typer(target, name=name)
        elif how == "merged":
            app.add_typer(target)
        else:
            app.command(name)(target)
    return app


def main() -> None:
    """Console entry: a FleetError becomes one red line and exit code 1 (or its exit_code)."""
    # pyinfra's SSH client (remote.py) logs what our commands say in one line per host (a refused key,
    # an absent ~/.ssh/known_hosts); nothing configures its logger here, so Python would print it raw.
    logging.getLogger("pyinfra").addHandler(logging.NullHandler())
    logging.getLogger("pyinfra").propagate = False
    try:
        rc = build_app(sys.argv[1] if len(sys.argv) > 1 else None)(standalone_mode=False)
    except FleetError as exc:
        # The message quotes values (host names, model ids, paths): never read as markup.
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(getattr(exc, "exit_code", 1))  # 2 where one asks for what the input cannot give
    except USAGE_ERRORS as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, typer.Abort, KeyboardInterrupt):  # Ctrl-C before a command sets its own handling
        err_console.print("aborted")
        sys.exit(130)
    except OSError as exc:  # a file this machine cannot read or write (a full disk, a permission): one line
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
