"""Local accounts: pyinfra's server.user behind one cheap fact comparison.

.. code:: python

    from ascend_fleet.operations import accounts
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import server

from ascend_fleet.facts.accounts import Account


@operation()
def user(user: str, home: str, shell: str, group: str | None = None, groups: list[str] | None = None,
         system: bool = False):
    """
    A user as pyinfra's server.user makes it (its home ensured, owned by it), left alone when the
    node has it so already: read with Account, one round trip, where server.user reads every
    account's lastlog first.

    + user: the user's name
    + home: its home directory
    + shell: its login shell
    + group: its primary group (None: as useradd picks it)
    + groups: its secondary groups, exactly
    + system: a system account (when created)
    """
    account = host.get_fact(Account, user=user)
    if account is not None and (account["home"], account["shell"]) == (home, shell) \
            and group in (None, account["group"]) and (groups is None or set(groups) == set(account["groups"])) \
            and account["home_owner"] is not None and account["home_owner"][0] == user \
            and group in (None, account["home_owner"][1]):
        host.noop(f"user {user} exists, home {home} owned by it")
        return
    yield from server.user._inner(user=user, home=home, shell=shell, group=group, groups=groups, system=system)
