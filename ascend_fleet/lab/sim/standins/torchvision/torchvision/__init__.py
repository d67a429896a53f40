"""Stand-in for torchvision on the lab's nodes: its version only (nothing on a lab node uses it)."""

from torchvision._version import __version__

__all__ = ["__version__"]
