"""Recordings: every sample the store takes, kept in one SQLite file per session, replayed, exported and
turned into a report. The schema is in tui.record.schema (and the README). Nothing here imports Textual."""
