"""Offline HTML pages: the page skeleton, tables and SVG charts shared by every report."""
