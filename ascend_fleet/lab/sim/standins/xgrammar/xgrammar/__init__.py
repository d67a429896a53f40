"""Stand-in for xgrammar: its version only, for the CUDA triton its real wheel requires on x86_64.

vllm and vllm-ascend require it; on a real x86_64 node it brings CUDA triton in (its Requires-Dist:
`triton; platform_system == "Linux" and platform_machine == "x86_64"`), which the profiles' uninstalls
take out, leaving it without (`pip check`: "xgrammar 0.2.9 requires triton, which is not installed.").
The simulated server does not import it.
"""

from xgrammar._version import __version__

__all__ = ["__version__"]
