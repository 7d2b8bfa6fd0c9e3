"""The job layer: which job holds which GPU, the SDK's agent side, per-job I/O.

Nothing here is imported by `import gpufeed`; the agent imports these modules when it wires
the "jobs", "sdk" and "job_io" collectors.
"""
