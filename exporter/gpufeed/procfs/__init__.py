"""Pure parsers for /proc files, each with a thin reader that takes `HostPaths`."""
