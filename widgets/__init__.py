"""Textual widgets: they draw what they are given and fetch nothing."""
