"""Stand-in for torch on the lab's nodes: its version, and a module for torch_npu to extend.

The torch_npu stand-in does `import torch` and sets `torch.npu`; nothing on a lab node runs
tensors, so nothing else is here.
"""

from torch._version import __version__

__all__ = ["__version__"]
