"""Rendering the project's Jinja2 templates: the only place config files are spelled."""

from __future__ import annotations

from pathlib import Path

import jinja2


def render(template: Path, **variables) -> str:
    """Render one template; a variable the template needs but was not given is an error."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return environment.get_template(template.name).render(**variables)
