"""What a pyinfra run works out once and every host's operations share: the fleet's capacity plan,
each host's validated config and stack profile, the pip index pages, the workers that spread packages.

A run is its State, which lives as long as the run: values die with it, so a process that runs
pyinfra more than once (the tests, a rollout reading the inventory between its runs) never sees
an earlier run's values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import TypeVar
from weakref import WeakKeyDictionary

from pyinfra.api import FactBase
from pyinfra.api.host import Host

from ascend_fleet.config.profile import Profile, load_profile

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


def profile_of_the_run(scope: object, name: str) -> Profile:
    """Stack profile `name` parsed once per run, or per loaded inventory in our own commands (the scope, as
    host_config has it): every host and instance asks for it, and one parse of a shipped profile takes tens
    of milliseconds. Keyed by the directory the run is in too, whose profiles/NAME.yaml comes before the
    package's (load_profile). The run's hosts share one: read it, never change it (its models are frozen,
    but not the lists and dicts in them)."""
    return once_per_run(scope, ("profile", name, os.getcwd()), lambda: load_profile(name))
