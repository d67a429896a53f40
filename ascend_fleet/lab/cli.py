"""`ascend-fleet lab ...` commands."""

import typer

lab_app = typer.Typer(no_args_is_help=True, help="The rehearsal lab: simulated Ascend nodes on this machine.")
