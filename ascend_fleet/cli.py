"""The `ascend-fleet` command: everything pyinfra alone does not do well."""

import sys

import click
import typer
from rich.console import Console

from ascend_fleet.bench import bench
from ascend_fleet.errors import FleetError
from ascend_fleet.lab.cli import lab_app
from ascend_fleet.plan_cli import plan
from ascend_fleet.profile_cli import profile_app
from ascend_fleet.rollout_cli import rollout_app
from ascend_fleet.status import status

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.add_typer(lab_app, name="lab")
app.command("plan")(plan)
app.add_typer(rollout_app)  # rollout, swap-model, load
app.add_typer(profile_app, name="profile")
app.command("status")(status)
app.command("bench")(bench)

err_console = Console(stderr=True)


def main() -> None:
    """Console entry: a FleetError becomes one red line and exit code 1."""
    try:
        rc = app(standalone_mode=False)
    except FleetError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        err_console.print("aborted")
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)
