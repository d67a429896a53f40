"""An nftables table loaded from a file, checked first, and taken out again."""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files

from ascend_fleet.facts.firewall import NftTableComment


@operation()
def nft_table(path: str, rules: str, family: str, table: str, comment: str):
    """
    Write an nftables file that defines one table, check it with `nft -c`, and load it: the
    table is replaced in one transaction. A file nft rejects is not kept and not loaded; the
    rules already loaded stay.

    + path: where the file lives (what the persistence unit loads at boot)
    + rules: the file's text; it deletes and redefines the table
    + family: the table's family, e.g. inet
    + table: the table's name
    + comment: the table's comment in rules: the fact that tells whether these rules are loaded
    """
    current = host.get_fact(Sha256File, path=path) == hashlib.sha256(rules.encode()).hexdigest()
    if current and host.get_fact(NftTableComment, family=family, table=table) == comment:
        host.noop(f"nftables table {family} {table} is loaded from {path}")
        return
    staged = f"{path}.new"
    yield from files.put._inner(src=StringIO(rules), dest=staged, mode="644")
    quoted, target = shlex.quote(staged), shlex.quote(path)
    yield (f"if ! out=$(nft -c -f {quoted} 2>&1); then rm -f {quoted}; "
           f"echo {shlex.quote(f'{host.name}: `nft -c` refused the rules for {path}, nothing changed:')} "
           f"\"$(printf '%s\\n' \"$out\" | grep -m1 -i error)\" >&2; exit 1; fi; "
           f"mv {quoted} {target} && nft -f {target}")


@operation()
def nft_table_absent(path: str, family: str, table: str):
    """
    Take a table out of the loaded rules and remove its file.

    + path: the table's file
    + family: the table's family
    + table: the table's name
    """
    loaded = host.get_fact(NftTableComment, family=family, table=table) is not None
    if not loaded and host.get_fact(Sha256File, path=path) is None:
        host.noop(f"no nftables table {family} {table}")
        return
    if loaded:
        yield f"nft delete table {family} {table}"
    yield f"rm -f {shlex.quote(path)}"
