"""The one error type that stops the simulated server at start-up."""


class StartupError(RuntimeError):
    """A start-up failure: logged as one line, then the process exits 1 as vLLM does."""
