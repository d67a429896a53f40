"""The one error type the CLI turns into a single clear line."""


class FleetError(Exception):
    """A failure the operator can act on: the message names what, where, and what to do."""
