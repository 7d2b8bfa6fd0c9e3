"""Where windows go: the durable windows log, /api/windows, tables and result files."""
