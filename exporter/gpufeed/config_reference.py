"""The configuration reference: what every config key means, and docs/configuration.md.

Keys and defaults are not written here: they come from the dataclasses in `gpufeed.config`,
so the page cannot drift from the code (tests/test_config_reference.py checks that every
key the parser accepts has a meaning here, that the documented ranges are the ones the
parser enforces, and that the committed page is this module's output).

    python -m gpufeed.config_reference > docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpufeed.config import AgentConfig


@dataclass(frozen=True, slots=True)
class KeyDoc:
    """One key's meaning, and the range the parser accepts for a number (None: no range)."""

    meaning: str
    minimum: float | None = None
    maximum: float | None = None


SECTIONS: tuple[tuple[str, str], ...] = (
    ("", "Node and sampling"),
    ("tiers", "Storage tiers"),
    ("tier_targets", "Storage tier targets"),
    ("correlator", "Live correlator"),
    ("sdk", "SDK socket"),
    ("jobs", "Jobs"),
    ("network", "Network fabric"),
    ("serving", "Inference serving"),
)

KEYS: dict[str, KeyDoc] = {
    "instance": KeyDoc(
        "This node's one name in traces, live windows, the windows log and OTLP; "
        "`--instance` overrides it. Empty: `HOSTNAME:PORT` (the listen port), as a static "
        "Prometheus target names the node, so live, file and Prometheus analyses join."
    ),
    "interval_seconds": KeyDoc(
        "How often every collector samples; `/metrics` serves the latest sample.", 0.05, 3600
    ),
    "collector_timeout_seconds": KeyDoc(
        "Time bound of one collector's call; a collector over it is marked failed for that "
        "sample. 0: 80% of the interval, at least 0.5 s. Capped at 5 intervals.",
        0,
        3600,
    ),
    "tier_targets": KeyDoc(
        "Tier name (one of `tiers`) -> what it is meant to deliver: `read_latency_seconds` "
        "(mean time per read, 1e-9..3600) and/or `read_bytes_per_second` (1..1e15). The "
        "agent exports them (`gpufeed_storage_tier_target_*`); the Storage dashboard draws "
        "each tier against them and `StorageTierMissesTarget` fires when a tier misses one "
        "while jobs wait for data. Example: `gpu_direct: {read_latency_seconds: 50e-6}`."
    ),
    "tiers": KeyDoc(
        "Tier name (lower-case letters, digits, `_`; not `unassigned`) -> mount points or "
        "paths inside a mount, one path or a list. Without `tiers` every block-device or "
        'network mount is exported as `tier="unassigned"`; with it, mounts in no tier are '
        "not exported. A path may be in one tier only. An entry `s3://BUCKET[/PREFIX]` "
        "(or `{url: s3://BUCKET[/PREFIX], endpoint: URL}` for a store that is not AWS) "
        "makes it an object-storage tier: the requests jobs report there count in it "
        "(docs/storage.md)."
    ),
    "correlator.threshold_ratio": KeyDoc(
        "A GPU below this utilization is underutilized.", 0.01, 1.0
    ),
    "correlator.min_window_seconds": KeyDoc(
        "How long a GPU must stay underutilized before a window opens.", 0, 86400
    ),
    "correlator.merge_gap_seconds": KeyDoc(
        "A window closes only once the GPU has been back above the threshold this long; "
        "shorter recoveries stay inside the window.",
        0,
        86400,
    ),
    "correlator.windows_log": KeyDoc(
        "File every closed window is appended to (JSON lines, fsynced, rotated); the agent "
        "reloads the recent ones from it at start for `/api/windows`. Empty: no log."
    ),
    "correlator.windows_log_max_bytes": KeyDoc(
        "Size at which the windows log is rotated.", 4096, 1 << 40
    ),
    "correlator.windows_log_backups": KeyDoc(
        "Rotated windows logs kept (`windows.jsonl.1` ...).", 0, 100
    ),
    "sdk.socket_path": KeyDoc(
        "Unix datagram socket the training-loop SDK and `gpufeed run` send to; "
        "`--sdk.socket` overrides it."
    ),
    "sdk.max_jobs": KeyDoc(
        "Jobs tracked at once, shared fairly between senders (a uid plus its Slurm job, "
        "Kubernetes pod or process group): when the table is full and no ended job can make "
        "room, a sender holding fewer than `max_jobs` / senders takes the least recently "
        "updated slot of the sender holding the most; otherwise the new job's messages are "
        "dropped and counted (`max_jobs`). See docs/jobs.md.",
        1,
        10000,
    ),
    "sdk.max_messages_per_second": KeyDoc(
        "SDK messages accepted per second in all, split equally between the senders heard "
        "from in the last 10 s (a token bucket each, one second of burst; a sender alone gets "
        "the whole rate); a sender's messages over its share are dropped and counted "
        "(`rate`). See docs/jobs.md.",
        1,
        10_000_000,
    ),
    "sdk.job_grace_seconds": KeyDoc(
        "How long an ended job (every process closed its `Job` or exited) keeps its series.",
        0,
        86400,
    ),
    "jobs.mapping_dir": KeyDoc(
        "dcgm-exporter style job-mapping directory (one file per GPU index holding job ids), "
        "as `deploy/slurm/gpufeed-prolog.sh` writes it. Empty: not used."
    ),
    "network.include_virtual": KeyDoc(
        "Also export virtual interfaces (veth, bridges, bonds, VLANs), whose bytes their "
        "physical interface counts too. Loopback is never exported."
    ),
    "network.xmit_wait_tick_bytes": KeyDoc(
        "Bytes of port time one InfiniBand `port_xmit_wait` tick stands for: 8 on NVIDIA "
        "Quantum-generation hardware, 32 x lanes on Switch-IB (`perfquery -c` shows it).",
        1,
        65536,
    ),
    "serving.endpoints": KeyDoc(
        "Serving stacks whose demand the agent scrapes (docs/serving.md): a list of "
        "`{url: http://HOST:PORT/metrics, job_id: ID, gpus: [0, 1], server: vllm}`; "
        "`url` and `job_id` and/or `gpus` are needed, `server` (vllm, triton, tgi) is "
        "recognised from the metric names when left out. A GPU whose serving job has no "
        "queued requests is `low_demand`, not a stall. At most 64. Jobs can declare their "
        "own endpoint instead (SDK `serving=True`, `gpufeed run --serving`)."
    ),
    "serving.timeout_seconds": KeyDoc(
        "How long one scrape of a serving endpoint may take in all (connecting, the "
        "headers and the whole body); a slower or failing endpoint is `gpufeed_serving_up` "
        "0 and leaves its demand absent, the rest is served.",
        0.01,
        10,
    ),
    "serving.max_body_bytes": KeyDoc(
        "The most body one scrape of an endpoint in `serving.endpoints` reads; a larger "
        'one fails (`reason="too_large"`). A vLLM answers tens of KB per engine.',
        4096,
        67108864,
    ),
    "serving.job_max_body_bytes": KeyDoc(
        "The same for the endpoints jobs declare (SDK `metrics_url`, `gpufeed run "
        "--serving-metrics`): what a job may make the agent, as root, read and parse.",
        4096,
        67108864,
    ),
}


def config_keys() -> Iterator[tuple[str, Any]]:
    """Every key of the config file with its default, from the dataclasses, in file order."""
    yield from _keys(AgentConfig(), "")


def _keys(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _keys(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if value == ():
        return "none"
    if value == "":
        return '`""`'
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def _range(doc: KeyDoc) -> str:
    if doc.minimum is None or doc.maximum is None:
        return ""
    return f"{_default(doc.minimum)}..{_default(doc.maximum)}".replace("``", "")


def _section(key: str) -> str:
    head = key.split(".")[0]
    return head if head in dict(SECTIONS) else ""


def render_markdown() -> str:
    keys = dict(config_keys())
    missing = sorted(set(keys) - set(KEYS))
    if missing:
        raise KeyError(f"config keys without a meaning in gpufeed.config_reference: {missing}")
    homeless = sorted(k for k in keys if "." in k and _section(k) == "")
    if homeless:
        raise KeyError(f"config keys in no section of gpufeed.config_reference: {homeless}")
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m gpufeed.config_reference`; "
        "tests/test_config_reference.py fails when it drifts. -->",
        "",
        "`gpufeed agent --config FILE` reads one YAML file; without it every key has its "
        "default. Unknown keys and bad values stop the agent at start with one line naming "
        "the file, the key and the line (`agent.yaml: line 3: tiers.hot: expected an "
        "absolute path, got 'nvme'`). `deploy/agent.example.yaml` is a complete example.",
        "",
    ]
    for section, title in SECTIONS:
        rows = [k for k in keys if _section(k) == section]
        out += [f"## {title}", "", "| key | default | range | meaning |", "|---|---|---|---|"]
        for key in rows:
            doc = KEYS[key]
            out.append(f"| `{key}` | {_default(keys[key])} | {_range(doc)} | {doc.meaning} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    sys.stdout.write(render_markdown())


if __name__ == "__main__":
    main()
