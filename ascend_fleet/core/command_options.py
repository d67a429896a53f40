"""The checks the commands share for their options: typer callbacks for numbers that mean nothing at 0 or
below, and the directory a command writes its results into."""

import math
from pathlib import Path

import typer

from ascend_fleet.core.errors import InputError, visible


def above_zero(value: float | None) -> float | None:
    """A typer callback for a number that means nothing at 0 or below (a duration, an interval, a size):
    typer's min= takes 0 itself, and a float option takes "nan" and "inf" (a wait that never ends). Refused
    as typer refuses, exit 2."""
    if value is not None and not 0 < value < math.inf:
        raise typer.BadParameter(f"{value:g}: expected a finite number above 0")
    return value


def above_zero_or_inf(value: float | None) -> float | None:
    """above_zero for a request rate, where inf means every request at once (vLLM's bench: --request-rate)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g}: expected a number above 0, or inf (all at once)")
    return value


def finite(value: float | None) -> float | None:
    """A typer callback beside min= on a float option: click's range lets nan and inf through (nan compares
    false with its bound), and a pause or timeout of either never ends or crashes where it is used."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value:g}: expected a finite number")
    return value


def result_directory(path: Path, option: str) -> Path:
    """The directory a command writes its results into, made if missing; refused in one line (exit 2) when
    the path is a file or cannot be made, before any run that would have nowhere to write."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{option} {visible(path)}: a file, not a directory; give a directory (made if "
                         "missing) for the results") from None
    except OSError as exc:
        raise InputError(f"{option} {visible(path)}: cannot be made ({exc.strerror}); give a directory this "
                         "user can write") from None
    return path
