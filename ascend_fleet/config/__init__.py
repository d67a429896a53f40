"""What the data says a host is: stack profiles, distribution releases, host data's schema and its validation, a
pyinfra host's config, secrets, and the fleet's records and lease."""
