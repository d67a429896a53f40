"""The ports the fleet's own services take on a host where the data does not place them. hostdata.host_ports
lists every port a host takes, these and those its data places, so that no two of them meet."""

# node_exporter's port on every worker and gateway (stages/monitoring.py serves it; the gateways may reach it as
# the monitoring hosts).
NODE_EXPORTER_PORT = 9100
# Prometheus and the nginx exporter on each gateway (stages/monitoring.py).
PROMETHEUS_PORT = 9090
NGINX_EXPORTER_PORT = 9113
NGINX_STATUS_PORT = 8080  # loopback only; the exporter's default scrape URI
# vllm-router always serves Prometheus metrics (it has no flag to turn them off): its own default port, kept
# on loopback, where the gateway's Prometheus may scrape it.
ROUTER_METRICS_PORT = 29000
