"""The typer apps of the commands whose work lives below (`ascend-fleet plan`, `rollout`, `drain`, `profile`,
`bundle`)."""
