"""rtnetlink: pure parsers of netlink messages plus thin socket readers (the agent\x27s own network namespace)."""
