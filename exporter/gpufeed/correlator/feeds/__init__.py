"""What feeds the engine: live snapshots, recorded traces and Prometheus range queries."""
