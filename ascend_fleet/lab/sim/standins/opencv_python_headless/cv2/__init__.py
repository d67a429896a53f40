"""Stand-in for opencv-python-headless on the lab's nodes: its version only (the simulator reads no image)."""

from cv2._version import __version__

__all__ = ["__version__"]
