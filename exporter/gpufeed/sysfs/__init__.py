"""Readers for /sys trees, each taking `HostPaths` so fixtures and containers work."""
