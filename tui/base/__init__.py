"""What the rest stands on: paths, API keys from files or env, processes and ports."""
