"""The style of each meaning, one table each, for every panel: an engine's health, a finding's severity, an
alarm. A panel picks from these; it does not spell a colour of its own for the same meaning."""

from __future__ import annotations

ALARM = "bold white on red"  # what must be acted on now: an alert, a crash, a throttled GPU

# An engine's health in its colour
HEALTH_COLOUR = {"up": "green", "loading": "yellow", "starting": "yellow", "down": "red"}
# ... as the engine's column and its detail head it: bold, the first thing read
HEALTH_STYLE = {health: f"bold {colour}" for health, colour in HEALTH_COLOUR.items()}
# ... as the fleet table's status column shows it, with the two states of its own: a row per engine, so only
# what is wrong is bold (a column of bold green would drown the few rows that are not)
STATUS_STYLE = {**HEALTH_COLOUR, "down": HEALTH_STYLE["down"], "stale": "bold yellow", "alert": ALARM}

# A finding's severity, as a label on a coloured ground: the same in the column, its one line in a long list
# and the detail (`enter`)
SEVERITY_STYLE = {"error": ALARM, "warning": "bold black on yellow", "info": "bold black on cyan"}
