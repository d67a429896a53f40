"""The `vllm` console script: `vllm serve` and `vllm --version`, the parts the lab uses."""

import sys

from vllm._version import __version__


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] in (["-v"], ["--version"]):
        print(__version__)
        return
    if argv[:1] != ["serve"]:
        sys.exit("usage: vllm serve [model_tag] [options]\nvllm: error: the simulated vLLM provides only `vllm serve`")
    from vllm._sim.server import run

    sys.exit(run(argv[1:], "serve"))


if __name__ == "__main__":
    main()
