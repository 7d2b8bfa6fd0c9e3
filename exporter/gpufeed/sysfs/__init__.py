"""Parsers and thin readers for files under /sys; the root comes from `HostPaths`."""
