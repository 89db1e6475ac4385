"""The store every source feeds, and the feed loop that reads the sources into it."""
