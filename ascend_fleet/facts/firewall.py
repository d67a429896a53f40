"""Facts about the node's nftables rules."""

from __future__ import annotations

from pyinfra.api import FactBase


class NftTableComment(FactBase):
    """The comment of a loaded nftables table ("" when it has none), or None when the table is not
    loaded (or nft is not installed)."""

    def command(self, family: str, table: str) -> str:
        return (f"if rules=$(nft list table {family} {table} 2>/dev/null); then echo loaded; "
                f"printf '%s\\n' \"$rules\" | sed -n '2s/^[[:space:]]*comment \"\\(.*\\)\"$/\\1/p'; fi; true")

    def process(self, output: list[str]) -> str | None:
        if output[:1] != ["loaded"]:
            return None
        return output[1] if len(output) > 1 else ""
