"""Reading the kernel over netlink (not a file tree): pure parsers of netlink messages plus
thin socket readers of the agent's own network namespace: rtnetlink (`qdisc`: the shaped
rate of a link) and socket diagnostics (`sockdiag`: TCP round-trip times), both framed by
`messages` (the header, alignment and message split they share)."""
