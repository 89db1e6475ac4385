"""Plain value types (targets, samples, events, statuses): they import nothing of the project."""
