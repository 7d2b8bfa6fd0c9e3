"""Job-level correlation: joins every node of a multi-node job (issue 13)."""
