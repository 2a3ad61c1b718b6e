"""The `specdepth` command line: the entry point, one module per subcommand, and the
argument types and prompt readers they share."""
