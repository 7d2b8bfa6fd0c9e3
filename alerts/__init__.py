"""gpufeed's Prometheus rules: recording rules and alerts, generated from `alerts.config`."""
