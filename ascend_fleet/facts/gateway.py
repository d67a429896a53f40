"""Facts about a gateway beyond its nginx config.

.. code:: python

    from ascend_fleet.facts.gateway import AddressHeld
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


class AddressHeld(FactBase[bool]):
    """
    Whether one of the host's interfaces has this IPv4 address now (keepalived adds the gateways'
    virtual address to the one gateway that holds it):

    .. code:: python

        True
    """

    @override
    def command(self, address: str):
        # `ip -o addr show to A` prints one line per interface address equal to (or within) A.
        return StringCommand("ip -o -4 addr show to", QuoteString(f"{address}/32"))

    @override
    def default(self) -> bool:  # no line printed: the address is not here
        return False

    @override
    def process(self, output) -> bool:
        return any(line.strip() for line in output)
