"""Rendering the project's Jinja2 templates: the only place config files are spelled."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2


def systemd_word(arg: str) -> str:
    """One argument of an Exec= line, written so that systemd splits it back into the same word:
    % and $ doubled (its specifiers and variables), quoted when it holds a space, a quote or a
    backslash (a JSON option such as --speculative-config's), and a lone ; as \\; (bare, it would
    separate commands, which a Type=exec unit refuses)."""
    if arg == ";":
        return "\\;"
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if re.search(r"""[\s"'\\]""", escaped):
        return "'" + escaped.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return escaped


def render(template: Path, **variables) -> str:
    """Render one template; a variable the template needs but was not given is an error."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    environment.filters["systemd_word"] = systemd_word
    return environment.get_template(template.name).render(**variables)
