"""Facts about files the deploy puts on a node.

.. code:: python

    from ascend_fleet.facts.files import FileState
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


class FileState(FactBase[dict | None]):
    """
    A regular file's owner, mode and sha256, in one command (pyinfra's File and Sha256File are one
    each):

    .. code:: python

        {"user": "root", "group": "root", "mode": 644, "sha256": "5f0c..."}

    Returns ``None`` when the path is not a regular file (missing, a directory).
    """

    @override
    def command(self, path: str):
        quoted = QuoteString(path)
        # From stdin: sha256sum escapes a name holding a newline or backslash by leading its line with "\".
        return StringCommand("if [ -f", quoted, "]; then stat -c '%U %G %a'", quoted, "&& sha256sum <", quoted, "; fi")

    @override
    def process(self, output) -> dict | None:
        lines = list(output)
        if len(lines) < 2 or len(owner := lines[0].split()) != 3:
            return None
        user, group, mode = owner
        return {"user": user, "group": group, "mode": int(mode), "sha256": lines[1].split()[0]}
