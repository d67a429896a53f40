"""`python -m vllm.entrypoints.openai.api_server`: the simulated server under the api_server CLI."""

import sys

from vllm._sim.server import run

if __name__ == "__main__":
    sys.exit(run(sys.argv[1:], "api_server"))
