"""The gateway group: Nginx in front of every instance of every worker."""

gateway = {
    "listen_port": 80,
    # field notes: `upstream vllm_backend { server 127.0.0.1:8000; server 127.0.0.1:8001; }`
    "upstream_name": "vllm_backend",
}
