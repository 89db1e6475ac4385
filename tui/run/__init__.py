"""Assembling a run: engine specs and profiles into targets, options into sources, snapshots."""
