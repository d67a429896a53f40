"""Stand-in for vLLM on the lab's simulated Ascend nodes.

`vllm serve` and `python -m vllm.entrypoints.openai.api_server` start the
simulated OpenAI-compatible server (vllm._sim); nothing else of vLLM exists.
"""

from vllm._version import __version__

__all__ = ["__version__"]
