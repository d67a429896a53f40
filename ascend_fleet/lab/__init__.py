"""The rehearsal lab: real-systemd nodes on one machine, and the simulated Ascend platform."""
