"""One instance of the multi-node lab (inventories/lab_multinode.py) over the hosts of group lab_pair_a,
its first the head; the guide's RPC port; the lab nodes reach each other on eth0 (the lab bridge)."""

data_parallel = {"group": "lab_pair_a", "rpc_port": 13389, "nic": "eth0"}
