"""What every layer shares: one-line errors, Huawei's version order, templates, SSH outside a deploy, the
checks of the commands' options, where things are (on a node, in a bundle, in a mirror's model tree, in a
PEP 503 index, the fleet's own ports) and what vLLM's /metrics says."""
