"""Honest comparisons: statistics, A/B and parameter sweeps, roofline, and the offline HTML report.

Data code only: nothing here imports Textual.
"""
