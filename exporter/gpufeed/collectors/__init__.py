"""Collectors, one per file; gpufeed.agent.wiring is the table that builds them for the agent."""
