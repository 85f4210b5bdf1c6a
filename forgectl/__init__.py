"""The `forgectl` command line."""
