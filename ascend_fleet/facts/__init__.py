"""pyinfra facts about Ascend nodes."""
