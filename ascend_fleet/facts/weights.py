"""Facts for the weights stage: what a node has staged, and the room left on its NVMe.

.. code:: python

    from ascend_fleet.facts.weights import FilesystemSpace, StagedModel
"""

from __future__ import annotations

import json
import re

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString, make_formatted_string_command
from typing_extensions import override

from ascend_fleet.core.node_layout import DEEP_VERIFY_NAME, MARKER_NAME, revision_dir

DEEP_VERIFY_HEADER, SIZES_HEADER = "--- deep verify", "--- sizes"
DF_LINE = re.compile(r"^\S+\s+(\d+)\s+\d+\s+(\d+)\s+\d+%\s+(.+)$")


class StagedModel(FactBase[dict | None]):
    """
    The marker a model revision's weights stage wrote, with the problems found on disk:

    .. code:: python

        {
            "model_id": "Qwen/Qwen3-8B",
            "revision": "v1",
            "manifest_sha256": "5f0c...",
            "source": "http://mirror/models/Qwen/Qwen3-8B/v1/",
            "files": {"config.json": {"size": 728, "sha256": "..."}, ...},
            "sizes": {"config.json": 728, ...},   # every file in the directory, as on disk
            "deep_verify": {"mismatched": {...}, ...},  # what the last deep verify recorded, or None
        }

    Returns ``None`` when ``<model_dir>/<org>/<name>/<revision>/`` holds no marker.
    Judge it with ``stage_weights.marker_problems(fact, fact["sizes"], model_id, revision)`` and
    ``stage_weights.deep_verify_of(fact, fact["deep_verify"])``; an unreadable marker comes back as
    ``{"sizes": ..., "unreadable": True}``.
    """

    @override
    def command(self, model_dir: str, model_id: str, revision: str) -> StringCommand:
        target = str(revision_dir(model_dir, model_id, revision))
        return make_formatted_string_command(
            "test -f {0}/{1} || exit 0; cat {0}/{1}; echo; echo {2}; cat {0}/{3} 2>/dev/null; echo; echo {4}; "
            "find {0} -type f -printf {5}",
            QuoteString(target), QuoteString(MARKER_NAME), QuoteString(DEEP_VERIFY_HEADER),
            QuoteString(DEEP_VERIFY_NAME), QuoteString(SIZES_HEADER), QuoteString("%s %P\\n"),
        )

    @override
    def process(self, output) -> dict | None:
        lines = list(output)
        if SIZES_HEADER not in lines:
            return None
        split = lines.index(SIZES_HEADER)
        middle = lines.index(DEEP_VERIFY_HEADER) if DEEP_VERIFY_HEADER in lines[:split] else split
        sizes = _sizes_by_name(lines[split + 1:])
        marker = _json_or_none(lines[:middle])
        if not isinstance(marker, dict):
            return {"sizes": sizes, "unreadable": True}
        return {**marker, "sizes": sizes, "deep_verify": _json_or_none(lines[middle + 1:split])}


def _json_or_none(lines: list[str]):
    try:
        return json.loads("\n".join(lines))
    except json.JSONDecodeError:
        return None


def _sizes_by_name(lines: list[str]) -> dict[str, int]:
    """`find -printf '%s %P'` lines: size, space, path relative to the directory."""
    sizes = {}
    for line in lines:
        size, _, name = line.partition(" ")
        if name:
            sizes[name] = int(size)
    return sizes


class FilesystemSpace(FactBase[dict | None]):
    """
    Size and free space of the filesystem holding a path (free: what a non-root writer may use):

    .. code:: python

        {"mount": "/mnt/nvme", "size_bytes": 8350298112, "free_bytes": 8333496320}

    Returns ``None`` when the path does not exist. Check ``mount`` too: a path
    whose NVMe is not mounted reports the root filesystem.
    """

    @override
    def command(self, path: str) -> StringCommand:
        return make_formatted_string_command("test -e {0} || exit 0; df -P -B1 {0} | tail -n 1", QuoteString(path))

    @override
    def process(self, output) -> dict | None:
        match = DF_LINE.match("\n".join(output).strip())
        if not match:
            return None
        size, free, mount = match.groups()
        return {"mount": mount, "size_bytes": int(size), "free_bytes": int(free)}
