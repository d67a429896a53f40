"""Stand-in for CUDA triton (import name `triton`), which PyPI's torch (x86_64; 2.11.0 aarch64 too) and
xgrammar (x86_64) require: its version only.

It owns site-packages/triton/ as the real wheel does, the directory triton-ascend's stand-in writes
too: whichever is installed last is what `import triton` finds, and uninstalling it deletes the
other's files there, as on a real node (upstream removes it before triton-ascend goes in).
"""

from triton._version import __version__

__all__ = ["__version__"]
