"""Collectors, one per file; gpufeed.wiring is the table that builds them for the agent."""
