"""The control commands' work: benchmarks, load, rollouts and swaps, status, tuning."""
