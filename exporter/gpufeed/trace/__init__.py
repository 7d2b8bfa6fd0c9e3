"""The trace format in one place: what the agent records (`--record`) and `gpufeed analyze`
reads: OpenMetrics text with timestamps.

- `format`: the format itself (header, label escaping, values, timestamps, end marker);
- `recorder`: the writer, a snapshot `Sink` (`TraceRecorder`, `finalize_recording`);
- `reader`: the parser into per-node series for the correlator (`read_trace`);
- `source`: the one opener of a trace file, plain or gzip/zstd-compressed (`open_trace`);
- `replay`: a trace replayed as the agent's snapshots, for the live/offline parity tests.

Nothing is imported here, so importing one part does not load the others.
"""
