"""once_per_run: one computation per pyinfra run (its State), none shared between runs."""

from __future__ import annotations

import gc

import pytest

from ascend_fleet.config.per_run import _VALUES, once_per_run


class Run:
    """Stands for a pyinfra State: any object that can be weakly referenced."""


def test_a_run_computes_once_and_another_run_computes_again():
    calls = []
    first, second = Run(), Run()
    for _ in range(3):
        assert once_per_run(first, "plan", lambda: calls.append("first") or len(calls)) == 1
    assert once_per_run(second, "plan", lambda: calls.append("second") or len(calls)) == 2
    assert calls == ["first", "second"]


def test_a_computation_that_raises_is_asked_again():
    run = Run()
    with pytest.raises(ValueError):
        once_per_run(run, "plan", lambda: (_ for _ in ()).throw(ValueError("does not fit")))
    assert once_per_run(run, "plan", lambda: "fits") == "fits"


def test_a_finished_run_keeps_nothing():
    run = Run()
    once_per_run(run, "plan", lambda: "x" * 1000)
    del run
    gc.collect()
    assert not any(isinstance(state, Run) for state in _VALUES.keys())
