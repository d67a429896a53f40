"""Stand-in for triton-ascend (import name `triton`) on the lab's nodes: its version only.

The lab's NPUs compile no kernels; the package is here so a node installs what vllm-ascend pins.
"""

from triton._version import __version__

__all__ = ["__version__"]
