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


def env_value(value: str) -> str:
    """One value of a systemd EnvironmentFile line, written so that systemd reads back the same string
    (systemd.exec(5), EnvironmentFile=): bare when it has no backslash (an escape, or at the end a line
    continuation), no surrounding blank (dropped) and no leading quote (which would open a quoted
    value); else double-quoted, with \\ before each of "\\`$, the characters a double-quoted value
    escapes. Newlines never reach here: host data refuses them and captured values are single lines."""
    if "\\" not in value and value == value.strip(" \t\r") and not value.startswith(("'", '"')):
        return value
    return '"' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


def comment_line(text: str) -> str:
    """Text after a comment's # on one line: each line break written as a space (a break would end the
    comment, and what follows it would be read as the file's data)."""
    return re.sub(r"[\r\n\v\f\x85\u2028\u2029]+", " ", text)


def render(template: Path, **variables) -> str:
    """Render one template; a variable the template needs but was not given is an error."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    environment.filters["systemd_word"] = systemd_word
    environment.filters["env_value"] = env_value
    environment.filters["comment_line"] = comment_line
    return environment.get_template(template.name).render(**variables)
