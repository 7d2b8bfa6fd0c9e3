"""The fault lab (issue 12): real workloads, real injected faults, scored end to end against
the real agent. See docs/lab.md."""
