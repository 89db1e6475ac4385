"""Honest probes of OpenAI-compatible engines: streamed chat completions timed on the client's clock,
token counts and server-side timings taken from the server, and concurrency sweeps. No Textual here.

Entry points: `ProbeRunner` (runner.py) for the dashboard, `ProbeClient.chat` (client.py) for one request,
`run_workload` (workloads.py), `run_sweep` / `iter_sweep` (sweep.py), `register` (cli.py) for the CLI.
"""
