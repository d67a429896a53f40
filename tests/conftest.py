"""Test-wide set-up.

pyinfra's CLI package gevent-patches the standard library when it is imported, as it is first
thing in every pyinfra run. Tests import it (inventory loading) among others; patched after `ssl`
was imported, every later HTTPS request in the process recurses forever. Imported here, first, the
test process is patched the way a pyinfra run is.
"""

import pyinfra_cli  # noqa: F401
import pytest  # noqa: E402  (after pyinfra_cli, for the reason above)

# scripts/test's three pytest runs, side by side (each takes lab subnets of its own): the tests on the
# session lab; the other modules with labs; the unit and simulator tests. A module marked `part(NAME)`
# runs in that part, to balance the three.
PARTS = ("session-lab", "other-labs", "unit-sim")
# The modules that share tests/lab/conftest.py's second_lab, in the order in which each finds the lab
# closest to what it needs: fresh nodes first; the 4-worker layout, grown from the 3, last.
SECOND_LAB_ORDER = tuple(f"tests/lab/{name}.py" for name in (
    "test_full_deploy", "test_rollout", "test_routing", "test_operators", "test_serving_qwen35", "test_multi_node"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--part", choices=PARTS,
                     help="only the tests on the session lab, only the other modules with labs, or only the "
                          "unit and simulator tests (scripts/test runs the three side by side: they share no lab)")


def part_of(item: pytest.Item) -> str:
    """The part a module is marked for (`pytest.mark.part(NAME)`), else: the session lab's when it uses
    the session's lab (tests/lab/conftest.py), other-labs when it uses another or is marked `lab`, else
    unit-sim."""
    if (marked := item.get_closest_marker("part")) is not None:
        if marked.args[0] not in PARTS:  # a typo would leave the module out of every part
            raise pytest.UsageError(f"{item.nodeid}: part {marked.args[0]!r} is none of {', '.join(PARTS)}")
        return marked.args[0]
    lab = item._fixtureinfo.name2fixturedefs.get("lab")
    if lab and lab[-1].scope == "session":
        return "session-lab"
    return "other-labs" if lab or item.get_closest_marker("lab") is not None else "unit-sim"


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
    kept, deselected = [], []
    for item in items:
        (kept if part_of(item) == part else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """A module whose tests wait mostly outside this machine (PyPI) starts that wait as soon as the run
    knows it has them, through a `start_early(items)` of its own, so that it overlaps the labs."""
    if session.config.option.collectonly:
        return
    by_module: dict = {}
    for item in session.items:
        if isinstance(item, pytest.Function):
            by_module.setdefault(item.module, []).append(item)
    for module, items in by_module.items():
        if start := getattr(module, "start_early", None):
            start(items)
