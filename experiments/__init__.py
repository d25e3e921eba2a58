"""The research layer: workloads, traces, metrics, the CLI and the figure scripts."""
