"""The GPU layer: one typed interface, two backends (real NVML, and a simulated fleet)."""
