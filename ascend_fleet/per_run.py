"""What a pyinfra run works out once and every host's operations share: the fleet's capacity plan,
each host's validated config, the pip index pages, the workers that spread packages.

A run is its State, which lives as long as the run: values die with it, so a process that runs
pyinfra more than once (the tests, a rollout reading the inventory between its runs) never sees
an earlier run's values.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar
from weakref import WeakKeyDictionary

from pyinfra.api import FactBase
from pyinfra.api.host import Host

T = TypeVar("T")
_VALUES: WeakKeyDictionary = WeakKeyDictionary()


def once_per_run(state: object, key: Hashable, compute: Callable[[], T]) -> T:
    """compute() the first time this run asks for key, then its value; a computation that raises
    is not kept, so the next host asks again (and fails the same way, naming itself)."""
    values = _VALUES.setdefault(state, {})
    if key not in values:
        values[key] = compute()
    return values[key]


def fact_of_the_run(host: Host, fact: type[FactBase[T]]) -> T:
    """A fact without arguments that no operation of a deploy changes (the host's release, its
    architecture), read once per host and run: the stages ask for them dozens of times, each a
    round trip, and pyinfra reads a fact again every time it is asked."""
    return once_per_run(host.state, (host.name, fact), lambda: host.get_fact(fact))
