"""Stand-in for vllm-ascend: the vLLM platform plugin for Ascend NPUs.

The simulated vLLM finds it through the `vllm.platform_plugins` entry point, as
real vLLM does, and refuses to start without it or with another release.
"""

from vllm_ascend._version import __version__


def register() -> str:
    """The platform class vLLM would load (real vllm-ascend returns this path)."""
    return "vllm_ascend.platform.NPUPlatform"


__all__ = ["__version__", "register"]
