"""The command line: one parser, shared option groups, one exit-code table, a module per command."""
