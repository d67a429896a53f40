"""What the whole fleet's data decides before and beside the stages: its plan and checks, multi-node instances,
`vllm serve`'s arguments, the firewall, the gateways' routes, virtual address and vllm-router, profile check,
lock and new, the OS repository and the bundle."""
