"""Stand-in for torch on the lab's nodes: its version, its C++ ABI, and a module for torch_npu to extend.

The torch_npu stand-in does `import torch` and sets `torch.npu`; nothing on a lab node runs
tensors, so nothing else is here. `compiled_with_cxx11_abi()` answers what the real wheel of
this version answers on this arch, because NNAL's ATB set_env.sh picks its library build by it
(docs/sim-fidelity.md: read from PyPI's wheels' TorchConfig.cmake).
"""

import platform

from torch._version import __version__

__all__ = ["__version__", "compiled_with_cxx11_abi"]


def compiled_with_cxx11_abi() -> bool:
    release = tuple(int(part) for part in __version__.split("+")[0].split(".")[:2])
    if release <= (2, 5):
        return False  # 2.4.0 and 2.5.1: -D_GLIBCXX_USE_CXX11_ABI=0 on both arches
    if release == (2, 6):
        return platform.machine() == "aarch64"  # 2.6.0: x86_64 0, aarch64 (manylinux_2_28) 1
    return True  # 2.7.1: 1; from 2.8 the old-ABI build is gone
