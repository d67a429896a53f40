"""The capacity planner and the performance model (standard library only: the lab's simulated vLLM carries
copies), and the published runs the model is fitted to."""
