"""The node agent (`gpufeed agent`): its command, the collector wiring, the sampler and the
HTTP server. Importing the package loads nothing; `command` holds the entry point."""
