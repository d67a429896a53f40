"""The serve stage: a systemd unit per vLLM instance; restarts only what changed. The instance
firewall first, so a port the data adds is closed to all but the gateway before it listens, and its
ports reserved, so no outgoing connection holds one when it binds."""

from ascend_fleet.stages.environment import reserved_ports_stage
from ascend_fleet.stages.firewall import firewall_stage
from ascend_fleet.stages.serving import serve_stage

firewall_stage()
reserved_ports_stage()
serve_stage()
