"""What a pyinfra run's output says it did, as the lab's tests and benchmarks read it."""

from __future__ import annotations

import re


def totals(output: str) -> dict[str, int]:
    """pyinfra's own Grand total line: operations, successes (changes), errors, no change."""
    cells = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", output).groups()
    return dict(zip(("operations", "changed", "errors", "unchanged"), (0 if c == "-" else int(c) for c in cells)))
