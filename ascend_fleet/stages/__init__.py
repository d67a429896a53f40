"""The deploy stages (pyinfra @deploy functions) that deploys/*.py run."""
