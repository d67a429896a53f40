"""Instance q397_a of inventories/prod_397b.py: the hosts of group q397_a, the first the head; the guide's
RPC port; the NIC the two nodes reach each other on (its HCCL_IF_IP is each host's serving_address)."""

data_parallel = {"group": "q397_a", "rpc_port": 13389, "api_server_count": 2, "nic": "enp67s0f0"}
