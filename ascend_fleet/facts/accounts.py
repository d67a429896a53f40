"""A local account as one cheap read: pyinfra's Users fact reads every account's lastlog (about 0.4 s
on a node), which a rerun paid for each account it ensures.

.. code:: python

    from ascend_fleet.facts.accounts import Account
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from typing_extensions import override


class Account(FactBase):
    """
    One user's home, shell, primary group, secondary groups and who owns its home, or None when there
    is no such user:

    .. code:: python

        {"home": "/home/HwHiAiUser", "shell": "/bin/bash", "group": "HwHiAiUser", "groups": ["video"],
         "home_owner": ("HwHiAiUser", "HwHiAiUser")}

    home_owner is None when the home directory does not exist.
    """

    @override
    def command(self, user: str) -> str:
        name = shlex.quote(user)
        return (f"entry=$(getent passwd {name}) || exit 0; echo \"$entry\"; id -gn {name}; id -Gn {name}; "
                "home=$(echo \"$entry\" | cut -d: -f6); stat -c '%U %G' \"$home\" 2>/dev/null; true")

    @override
    def process(self, output) -> dict | None:
        lines = list(output)
        if len(lines) < 3:
            return None
        fields = lines[0].split(":")
        group = lines[1].strip()
        owner = tuple(lines[3].split()) if len(lines) > 3 else None
        return {"home": fields[5], "shell": fields[6], "group": group,
                "groups": [name for name in lines[2].split() if name != group], "home_owner": owner}

    @override
    def default(self):
        return None
