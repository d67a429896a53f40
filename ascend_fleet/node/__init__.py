"""Programs shipped to the nodes and run there (weights stager, wheel peer helper, NPU metrics):
the standard library only, since a node has nothing else before the deploy gives it a Python stack.
The controller imports them for their names and parsers; tests/unit/test_node_programs.py holds
them to the standard library."""
