"""ascend-fleet: provision Ascend 910B fleets from a fresh OS to serving vLLM Ascend behind Nginx."""

from pathlib import Path

# The checkout this package runs from (its tests and example fleet); a non-editable install has none.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Package data: every config file the project writes is a template here.
TEMPLATES = Path(__file__).resolve().parent / "templates"
# Package data too: the supported stacks (profile.py also reads profiles/ where it runs).
PROFILES = Path(__file__).resolve().parent / "profiles"
# Where operators put what the control machine holds for a fleet, in the folder ascend-fleet or
# pyinfra runs from (as state/): the vendor .run files, and model configs to plan with
# (models/<org>/<name>/<revision>/config.json).
FILES = Path("files")
