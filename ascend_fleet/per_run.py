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

T = TypeVar("T")
_VALUES: WeakKeyDictionary = WeakKeyDictionary()


def once_per_run(state: object, key: Hashable, compute: Callable[[], T]) -> T:
    """compute() the first time this run asks for key, then its value; a computation that raises
    is not kept, so the next host asks again (and fails the same way, naming itself)."""
    values = _VALUES.setdefault(state, {})
    if key not in values:
        values[key] = compute()
    return values[key]
