"""The fleet: many engines and remote GPUs read through a Prometheus (or straight from dcgm-exporter).

Nothing here imports Textual: the fleet sources are feed sources (tui.live.feed) like any
other, and the screens
that show the fleet live in tui.ui.screens.
"""
