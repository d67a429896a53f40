"""Stage 7: a systemd unit per vLLM instance; restarts only what changed."""

from ascend_fleet.stages.serving import serve_stage

serve_stage()
