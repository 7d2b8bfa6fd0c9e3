"""`gpufeed fleet`: the live, job-level view of a whole fleet from its Prometheus-compatible
TSDB (see docs/fleet.md)."""
