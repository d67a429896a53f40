"""Stand-in for torchaudio on the lab's nodes: its version only (nothing on a lab node uses it)."""

from torchaudio._version import __version__

__all__ = ["__version__"]
