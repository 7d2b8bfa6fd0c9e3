"""The multi-node part of the fault lab: 2-4 "nodes" on one host (network namespaces), one
torch.distributed job across them, faults on one node (docs/lab.md, "Multi-node on one
host"). Run with `python -m lab.multinode.run`."""
