"""Judging what the engines publish and what the traffic shows into findings (tui.model.findings).
Imports only values: the store, the proxy, bench runs, reports and the exporter all judge with the
same code."""
