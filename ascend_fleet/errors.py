"""The one error type operators see: the CLI and pyinfra both print it as a single line."""

from pyinfra.api.exceptions import PyinfraError


class FleetError(PyinfraError):
    """A failure the operator can act on: the message names what, where, and what to do.

    A PyinfraError, so raised while pyinfra prepares a deploy it stops the run before any
    host is changed and prints `pyinfra error: <message>`, not a traceback.
    """
