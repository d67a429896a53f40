"""One instance of the multi-node lab (inventories/lab_multinode.py) over the hosts of group lab_pair_b,
its first the head; the guide's RPC port; the lab nodes reach each other on eth0 (the lab bridge)."""

data_parallel = {"group": "lab_pair_b", "rpc_port": 13389, "nic": "eth0"}
