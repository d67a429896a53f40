"""Test-wide set-up.

pyinfra's CLI package gevent-patches the standard library when it is imported, as it is first
thing in every pyinfra run. Tests import it (inventory loading) among others; patched after `ssl`
was imported, every later HTTPS request in the process recurses forever. Imported here, first, the
test process is patched the way a pyinfra run is.
"""

import pyinfra_cli  # noqa: F401
import pytest  # noqa: E402  (after pyinfra_cli, for the reason above)

PARTS = ("session-lab", "others")
# The modules that share tests/lab/conftest.py's second_lab, in the order in which each finds the lab
# closest to what it needs: fresh nodes first; the 4-worker layout, grown from the 3, last.
SECOND_LAB_ORDER = tuple(f"tests/lab/{name}.py" for name in (
    "test_full_deploy", "test_rollout", "test_routing", "test_operators", "test_serving_qwen35", "test_multi_node"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--part", choices=PARTS,
                     help="only the tests on the session lab (and the real tier's), or only the others "
                          "(scripts/test runs the two side by side: they share no lab)")


def in_session_lab_part(item: pytest.Item) -> bool:
    """The test uses the session's lab (tests/lab/conftest.py), not a lab of its module's own, or its
    module is marked to run beside it (the real tier: that part would otherwise end 15 min first)."""
    lab = item._fixtureinfo.name2fixturedefs.get("lab")
    return (bool(lab) and lab[-1].scope == "session") or item.get_closest_marker("session_lab_part") is not None


def in_second_lab_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items, with those of SECOND_LAB_ORDER's modules moved together, where the first of them
    was, in that order (each module's own in theirs)."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    shared = [item for item in items if module(item) in SECOND_LAB_ORDER]
    if not shared:
        return items
    first = items.index(shared[0])
    rest = [item for item in items if module(item) not in SECOND_LAB_ORDER]
    return rest[:first] + sorted(shared, key=lambda item: SECOND_LAB_ORDER.index(module(item))) + rest[first:]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = in_second_lab_order(items)
    part = config.getoption("--part")
    if part is None:
        return
    wanted = part == "session-lab"
    kept, deselected = [], []
    for item in items:
        (kept if in_session_lab_part(item) == wanted else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """A module whose tests wait mostly outside this machine (PyPI) starts that wait as soon as the run
    knows it has them, through a `start_early(items)` of its own, so that it overlaps the labs."""
    modules = dict.fromkeys(item.module for item in session.items if isinstance(item, pytest.Function))
    for module in modules:
        if start := getattr(module, "start_early", None):
            start([item for item in session.items if getattr(item, "module", None) is module])
