"""pyinfra operations for Ascend nodes."""
