"""The cluster's scheduler, read once per cluster (`gpufeed scheduler`): GPU jobs that pend,
how long they have waited, the GPUs free on each node, and the scheduler's cycle time.

`backlog` holds the scheduler-neutral model and the one judgement made here (do the free
GPUs fit a pending job?); `slurm` and `kubernetes` parse each scheduler's own answers into
it; `collector` turns a reading into the contract families; `command` serves them.
"""
