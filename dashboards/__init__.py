"""gpufeed's Grafana dashboards: one `*.dashboard.py` per dashboard, house style in `presets`."""
