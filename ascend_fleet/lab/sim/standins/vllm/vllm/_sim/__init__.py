"""The simulated vLLM server: vLLM's CLI and HTTP surface over simulated NPUs."""
