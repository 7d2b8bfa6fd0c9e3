"""Agent configuration: a YAML file validated into frozen dataclasses.

Every error names the key and the line it is on, because the person reading it is an SRE
editing a config map at 3 a.m. Unknown keys are errors too: a typo must not silently
disable a tier.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufeed import vocabulary
from gpufeed.serving.endpoints import (
    MAX_BODY_BYTES,
    MAX_ENDPOINTS,
    MIN_BODY_BYTES,
    ServingEndpoint,
    url_problem,
)
from gpufeed.serving.stacks import SERVERS
from gpufeed.storage.objects import ObjectTierEntry, normalise_endpoint, parse_s3_url

DEFAULT_SDK_SOCKET = "/run/gpufeed/sdk.sock"
DEFAULT_WINDOWS_LOG = "/var/lib/gpufeed/windows.jsonl"
# NVIDIA Quantum-generation hardware advances port_xmit_wait once per 8 bytes of port time
# (PortSamplesControl Tick = 7, i.e. 8 symbol times); see docs/collectors-network-host.md.
DEFAULT_XMIT_WAIT_TICK_BYTES = 8.0
TIER_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")
# The YAML 1.2 core schema's float (PyYAML resolves YAML 1.1, where `1e308` is a string).
_FLOAT_1_2 = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


class ConfigError(ValueError):
    """A configuration problem, with the file, key and line in its message."""


@dataclass(frozen=True, slots=True)
class TierConfig:
    name: str
    paths: tuple[str, ...]
    # S3 locations (`s3://BUCKET[/PREFIX]`, optionally at one endpoint): an object-storage
    # tier, or a tier that is both a mount and a bucket (gpufeed.storage.objects)
    objects: tuple[ObjectTierEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class TierTarget:
    """What a tier is meant to deliver (None: no target stated)."""

    tier: str
    read_latency_seconds: float | None = None
    read_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class CorrelatorConfig:
    threshold_ratio: float = vocabulary.DEFAULT_THRESHOLD_RATIO
    min_window_seconds: float = vocabulary.DEFAULT_MIN_WINDOW_SECONDS
    merge_gap_seconds: float = vocabulary.DEFAULT_MERGE_GAP_SECONDS
    windows_log: str = DEFAULT_WINDOWS_LOG
    windows_log_max_bytes: int = 16 * 1024 * 1024
    windows_log_backups: int = 3


@dataclass(frozen=True, slots=True)
class SdkConfig:
    socket_path: str = DEFAULT_SDK_SOCKET
    max_jobs: int = 64
    max_messages_per_second: int = 20000
    job_grace_seconds: float = 300.0


@dataclass(frozen=True, slots=True)
class JobsConfig:
    mapping_dir: str = ""  # dcgm-exporter compatible --hpc-job-mapping-dir; empty = off


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    # Virtual interfaces (veth, bridges, bonds, VLANs) carry bytes that their physical parent
    # also counts, so they are off unless asked for (docs/collectors-network-host.md).
    include_virtual: bool = False
    xmit_wait_tick_bytes: float = DEFAULT_XMIT_WAIT_TICK_BYTES


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """Serving endpoints the agent scrapes for demand (docs/serving.md), beside those jobs
    declare themselves; each scrape takes at most `timeout_seconds` in all, and reads at
    most `max_body_bytes` of body (`job_max_body_bytes` from an endpoint a job declared)."""

    endpoints: tuple[ServingEndpoint, ...] = ()
    timeout_seconds: float = 0.5
    # vLLM's /metrics is tens of KB per engine (its histograms, per model): 8 MiB leaves the
    # administrator's endpoints room, and 1 MiB bounds what a job makes the agent parse
    max_body_bytes: int = 8 << 20
    job_max_body_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class AgentConfig:
    # This node's name in traces, windows and OTLP; empty: HOSTNAME:PORT (see agent.py)
    instance: str = ""
    interval_seconds: float = 1.0
    collector_timeout_seconds: float = 0.0  # 0 = derived from the interval
    tiers: tuple[TierConfig, ...] = ()
    tier_targets: tuple[TierTarget, ...] = ()
    correlator: CorrelatorConfig = field(default_factory=CorrelatorConfig)
    sdk: SdkConfig = field(default_factory=SdkConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)

    @property
    def object_tiers(self) -> tuple[tuple[str, ObjectTierEntry], ...]:
        """(tier name, entry) of every s3:// entry, in config order."""
        return tuple((t.name, e) for t in self.tiers for e in t.objects)

    @property
    def effective_timeout_seconds(self) -> float:
        if self.collector_timeout_seconds > 0:
            return self.collector_timeout_seconds
        return max(0.5, 0.8 * self.interval_seconds)


def read_yaml_text(
    path: str | Path, what: str, error: type[ConfigError] = ConfigError
) -> tuple[str, str]:
    """The text of a YAML file and the name to quote in errors; unreadable is an `error`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise error(f"{p}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8"), str(p)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        bad = data[exc.start]
        raise error(f"{p}: line {line}: not UTF-8 text (byte 0x{bad:02x})") from None


def load_config(path: str | Path | None) -> AgentConfig:
    """Reads and validates a config file; None gives the defaults."""
    if path is None:
        return AgentConfig()
    return parse_config(*read_yaml_text(path, "config file"))


def compose_yaml(
    text: str, source: str, error: type[ConfigError] = ConfigError
) -> yaml.Node | None:
    """The YAML node tree (None for an empty document); a syntax error names its line."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{source}:{where}: invalid YAML: {problem}") from exc


def parse_config(text: str, source: str = "<config>") -> AgentConfig:
    root = compose_yaml(text, source)
    if root is None:
        return AgentConfig()
    r = _Reader(source)
    top = r.mapping(root, "config")
    known = {
        "instance",
        "interval_seconds",
        "collector_timeout_seconds",
        "tiers",
        "tier_targets",
        "correlator",
        "sdk",
        "jobs",
        "network",
        "serving",
    }
    r.no_unknown(top, known, "")
    instance = r.string(top, "instance", "")
    interval = r.number(top, "interval_seconds", 1.0, minimum=0.05, maximum=3600)
    timeout = r.number(top, "collector_timeout_seconds", 0.0, minimum=0.0, maximum=3600)
    tiers = r.tiers(top.get("tiers"))
    targets = r.tier_targets(top.get("tier_targets"), {t.name for t in tiers})
    corr = r.correlator(top.get("correlator"))
    sdk = r.sdk(top.get("sdk"))
    jobs = r.jobs(top.get("jobs"))
    network = r.network(top.get("network"))
    serving = r.serving(top.get("serving"))
    return AgentConfig(
        instance=instance,
        interval_seconds=interval,
        collector_timeout_seconds=timeout,
        tiers=tiers,
        tier_targets=targets,
        correlator=corr,
        sdk=sdk,
        jobs=jobs,
        network=network,
        serving=serving,
    )


def _empty(node: yaml.Node) -> bool:
    """An empty value: null, "", [] or {}."""
    if isinstance(node, yaml.ScalarNode):
        return node.value in ("", "null", "~")
    return isinstance(node, yaml.SequenceNode | yaml.MappingNode) and not node.value


class _Reader:
    """Walks composed YAML nodes so that every error can name its line."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: yaml.Node | None, key: str, msg: str) -> ConfigError:
        line = f" line {node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(f"{self.source}:{line}: {key}: {msg}")

    def mapping(self, node: yaml.Node, key: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "expected a mapping of keys to values")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.fail(k, key, "keys must be plain strings")
            if k.value in out:
                raise self.fail(
                    k, f"{key}.{k.value}" if key != "config" else k.value, "duplicate key"
                )
            out[k.value] = (k, v)
        return out

    def no_unknown(
        self, m: dict[str, tuple[yaml.Node, yaml.Node]], known: set[str], prefix: str
    ) -> None:
        for name, (knode, _) in m.items():
            if name not in known:
                raise self.fail(
                    knode,
                    prefix + name,
                    f"unknown key (known keys: {', '.join(sorted(known))})",
                )

    def scalar(self, node: yaml.Node) -> Any:
        return yaml.safe_load(yaml.serialize(node))

    def number(
        self,
        m: dict[str, tuple[yaml.Node, yaml.Node]],
        key: str,
        default: float,
        *,
        minimum: float,
        maximum: float,
        prefix: str = "",
    ) -> float:
        if key not in m:
            return default
        _, node = m[key]
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        plain = isinstance(node, yaml.ScalarNode) and node.style is None
        if isinstance(value, str) and plain and _FLOAT_1_2.fullmatch(value):
            value = float(value)  # YAML 1.2 reads `1e308` as a number; YAML 1.1 needed `1.0e+308`
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(node, prefix + key, f"expected a number, got {_show(node)}")
        if not math.isfinite(value):
            raise self.fail(node, prefix + key, f"expected a finite number, got {_show(node)}")
        if not minimum <= float(value) <= maximum:
            raise self.fail(node, prefix + key, f"must be between {minimum:g} and {maximum:g}")
        return float(value)

    def integer(
        self,
        m: dict[str, tuple[yaml.Node, yaml.Node]],
        key: str,
        default: int,
        *,
        minimum: int,
        maximum: int,
        prefix: str = "",
    ) -> int:
        if key not in m:
            return default
        _, node = m[key]
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(node, prefix + key, f"expected an integer, got {_show(node)}")
        if not minimum <= value <= maximum:
            raise self.fail(node, prefix + key, f"must be between {minimum} and {maximum}")
        return value

    def string(
        self, m: dict[str, tuple[yaml.Node, yaml.Node]], key: str, default: str, prefix: str = ""
    ) -> str:
        if key not in m:
            return default
        _, node = m[key]
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, str):
            raise self.fail(node, prefix + key, f"expected a string, got {_show(node)}")
        return value

    def boolean(
        self, m: dict[str, tuple[yaml.Node, yaml.Node]], key: str, default: bool, prefix: str = ""
    ) -> bool:
        if key not in m:
            return default
        _, node = m[key]
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, bool):
            raise self.fail(node, prefix + key, f"expected true or false, got {_show(node)}")
        return value

    def tiers(self, entry: tuple[yaml.Node, yaml.Node] | None) -> tuple[TierConfig, ...]:
        if entry is None:
            return ()
        _, node = entry
        if isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~"):
            return ()
        m = self.mapping(node, "tiers")
        out: list[TierConfig] = []
        seen: dict[str, str] = {}
        for name, (knode, vnode) in m.items():
            key = f"tiers.{name}"
            if not name or not set(name) <= TIER_NAME_CHARS or name == "unassigned":
                raise self.fail(
                    knode,
                    key,
                    "tier names are lower-case letters, digits and '_' (not 'unassigned')",
                )
            if isinstance(vnode, yaml.ScalarNode):
                items = [vnode]
            elif isinstance(vnode, yaml.SequenceNode):
                items = list(vnode.value)
            else:
                raise self.fail(vnode, key, "expected a list of mount points or paths")
            paths: list[str] = []
            objects: list[ObjectTierEntry] = []
            for item in items:
                if isinstance(item, yaml.MappingNode) or (
                    isinstance(item, yaml.ScalarNode) and item.value.startswith("s3:")
                ):
                    obj = self.object_entry(item, key)
                    where = obj.url + (f" at {obj.endpoint}" if obj.endpoint else "")
                    if where in seen:
                        raise self.fail(item, key, f"{where} is already in tier {seen[where]!r}")
                    seen[where] = name
                    objects.append(obj)
                    continue
                value = self.scalar(item) if isinstance(item, yaml.ScalarNode) else None
                if not isinstance(value, str) or not value.startswith("/"):
                    raise self.fail(
                        item,
                        key,
                        f"expected an absolute path or s3://BUCKET[/PREFIX], got {_show(item)}",
                    )
                norm = "/" + value.strip("/") if value != "/" else "/"
                if norm in seen:
                    raise self.fail(item, key, f"{norm} is already in tier {seen[norm]!r}")
                seen[norm] = name
                paths.append(norm)
            if not paths and not objects:
                raise self.fail(vnode, key, "a tier needs at least one path or s3:// location")
            out.append(TierConfig(name, tuple(paths), tuple(objects)))
        return tuple(out)

    def object_entry(self, node: yaml.Node, key: str) -> ObjectTierEntry:
        """`s3://BUCKET[/PREFIX]`, or a mapping {url: s3://..., endpoint: URL} for a store
        that is not AWS (MinIO, Ceph, a vendor's appliance)."""
        endpoint = ""
        if isinstance(node, yaml.MappingNode):
            m = self.mapping(node, key)
            self.no_unknown(m, {"url", "endpoint"}, key + ".")
            if "url" not in m:
                raise self.fail(node, key, "an object-storage entry needs url: s3://BUCKET")
            url = self.string(m, "url", "", key + ".")
            text = self.string(m, "endpoint", "", key + ".")
            if "endpoint" in m:
                got = normalise_endpoint(text)
                if got is None:
                    raise self.fail(
                        m["endpoint"][1],
                        key + ".endpoint",
                        f"expected an http:// or https:// URL of a host, got {text!r}",
                    )
                endpoint = got
            node = m["url"][1]
        else:
            url = self.scalar(node)
        parsed = parse_s3_url(url) if isinstance(url, str) else f"expected s3://..., got {url!r}"
        if isinstance(parsed, str):
            raise self.fail(node, key, parsed)
        return ObjectTierEntry(parsed[0], parsed[1], endpoint)

    def tier_targets(
        self, entry: tuple[yaml.Node, yaml.Node] | None, tiers: set[str]
    ) -> tuple[TierTarget, ...]:
        """tier -> {read_latency_seconds, read_bytes_per_second}, for tiers in `tiers`."""
        if entry is None or _empty(entry[1]):
            return ()
        out: list[TierTarget] = []
        for name, (knode, vnode) in self.mapping(entry[1], "tier_targets").items():
            key = f"tier_targets.{name}"
            if name not in tiers:
                raise self.fail(knode, key, f"no tier {name!r} in tiers")
            m = self.mapping(vnode, key)
            p = key + "."
            self.no_unknown(m, {"read_latency_seconds", "read_bytes_per_second"}, p)
            if not m:
                raise self.fail(
                    vnode, key, "expected read_latency_seconds and/or read_bytes_per_second"
                )
            lat = self.number(m, "read_latency_seconds", 0.0, minimum=1e-9, maximum=3600, prefix=p)
            bps = self.number(m, "read_bytes_per_second", 0.0, minimum=1.0, maximum=1e15, prefix=p)
            out.append(TierTarget(name, lat or None, bps or None))
        return tuple(out)

    def correlator(self, entry: tuple[yaml.Node, yaml.Node] | None) -> CorrelatorConfig:
        d = CorrelatorConfig()
        if entry is None:
            return d
        m = self.mapping(entry[1], "correlator")
        p = "correlator."
        self.no_unknown(
            m,
            {
                "threshold_ratio",
                "min_window_seconds",
                "merge_gap_seconds",
                "windows_log",
                "windows_log_max_bytes",
                "windows_log_backups",
            },
            p,
        )
        return CorrelatorConfig(
            threshold_ratio=self.number(
                m, "threshold_ratio", d.threshold_ratio, minimum=0.01, maximum=1.0, prefix=p
            ),
            min_window_seconds=self.number(
                m, "min_window_seconds", d.min_window_seconds, minimum=0, maximum=86400, prefix=p
            ),
            merge_gap_seconds=self.number(
                m, "merge_gap_seconds", d.merge_gap_seconds, minimum=0, maximum=86400, prefix=p
            ),
            windows_log=self.string(m, "windows_log", d.windows_log, prefix=p),
            windows_log_max_bytes=self.integer(
                m,
                "windows_log_max_bytes",
                d.windows_log_max_bytes,
                minimum=4096,
                maximum=1 << 40,
                prefix=p,
            ),
            windows_log_backups=self.integer(
                m, "windows_log_backups", d.windows_log_backups, minimum=0, maximum=100, prefix=p
            ),
        )

    def sdk(self, entry: tuple[yaml.Node, yaml.Node] | None) -> SdkConfig:
        d = SdkConfig()
        if entry is None:
            return d
        m = self.mapping(entry[1], "sdk")
        p = "sdk."
        self.no_unknown(
            m, {"socket_path", "max_jobs", "max_messages_per_second", "job_grace_seconds"}, p
        )
        return SdkConfig(
            socket_path=self.string(m, "socket_path", d.socket_path, prefix=p),
            max_jobs=self.integer(m, "max_jobs", d.max_jobs, minimum=1, maximum=10000, prefix=p),
            max_messages_per_second=self.integer(
                m,
                "max_messages_per_second",
                d.max_messages_per_second,
                minimum=1,
                maximum=10_000_000,
                prefix=p,
            ),
            job_grace_seconds=self.number(
                m, "job_grace_seconds", d.job_grace_seconds, minimum=0, maximum=86400, prefix=p
            ),
        )

    def jobs(self, entry: tuple[yaml.Node, yaml.Node] | None) -> JobsConfig:
        d = JobsConfig()
        if entry is None:
            return d
        m = self.mapping(entry[1], "jobs")
        self.no_unknown(m, {"mapping_dir"}, "jobs.")
        return JobsConfig(mapping_dir=self.string(m, "mapping_dir", d.mapping_dir, prefix="jobs."))

    def network(self, entry: tuple[yaml.Node, yaml.Node] | None) -> NetworkConfig:
        d = NetworkConfig()
        if entry is None:
            return d
        m = self.mapping(entry[1], "network")
        p = "network."
        self.no_unknown(m, {"include_virtual", "xmit_wait_tick_bytes"}, p)
        return NetworkConfig(
            include_virtual=self.boolean(m, "include_virtual", d.include_virtual, prefix=p),
            # Quantum parts count 8 bytes a tick, Switch-IB 32 per lane (384 on 12X); the
            # upper bound only catches a value typed in bits or by the wrong unit.
            xmit_wait_tick_bytes=self.number(
                m,
                "xmit_wait_tick_bytes",
                d.xmit_wait_tick_bytes,
                minimum=1,
                maximum=65536,
                prefix=p,
            ),
        )

    def serving(self, entry: tuple[yaml.Node, yaml.Node] | None) -> ServingConfig:
        d = ServingConfig()
        if entry is None or _empty(entry[1]):
            return d
        m = self.mapping(entry[1], "serving")
        p = "serving."
        self.no_unknown(
            m, {"endpoints", "timeout_seconds", "max_body_bytes", "job_max_body_bytes"}, p
        )
        timeout = self.number(
            m, "timeout_seconds", d.timeout_seconds, minimum=0.01, maximum=10, prefix=p
        )
        body, job_body = (
            self.integer(m, k, default, minimum=MIN_BODY_BYTES, maximum=MAX_BODY_BYTES, prefix=p)
            for k, default in (
                ("max_body_bytes", d.max_body_bytes),
                ("job_max_body_bytes", d.job_max_body_bytes),
            )
        )
        out: list[ServingEndpoint] = []
        node = m["endpoints"][1] if "endpoints" in m else None
        if node is not None and not _empty(node):
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, p + "endpoints", "expected a list of endpoints")
            if len(node.value) > MAX_ENDPOINTS:
                raise self.fail(node, p + "endpoints", f"at most {MAX_ENDPOINTS} endpoints")
            for i, item in enumerate(node.value):
                out.append(self.serving_endpoint(item, f"{p}endpoints[{i}]"))
        return ServingConfig(tuple(out), timeout, body, job_body)

    def serving_endpoint(self, node: yaml.Node, key: str) -> ServingEndpoint:
        """{url, job_id and/or gpus, server?}: which job's or GPUs' serving stack it is."""
        m = self.mapping(node, key)
        p = key + "."
        self.no_unknown(m, {"url", "job_id", "gpus", "server"}, p)
        if "url" not in m:
            raise self.fail(node, key, "needs url: the serving stack's metrics URL")
        url = self.string(m, "url", "", prefix=p)
        problem = url_problem(url, loopback_only=False)
        if problem is not None:
            raise self.fail(m["url"][1], p + "url", problem)
        job_id = self.string(m, "job_id", "", prefix=p)
        gpus: list[str] = []
        if "gpus" in m:
            gnode = m["gpus"][1]
            items = gnode.value if isinstance(gnode, yaml.SequenceNode) else [gnode]
            for g in items:
                v = self.scalar(g) if isinstance(g, yaml.ScalarNode) else None
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1024:
                    raise self.fail(g, p + "gpus", f"expected GPU indexes, got {_show(g)}")
                gpus.append(str(v))
        if not job_id and not gpus:
            raise self.fail(node, key, "needs job_id or gpus: whose demand the endpoint tells")
        server = self.string(m, "server", "", prefix=p)
        if server and server not in SERVERS:
            raise self.fail(m["server"][1], p + "server", f"expected one of {', '.join(SERVERS)}")
        return ServingEndpoint(url, job_id, tuple(gpus), server)


def _show(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return repr(node.value)
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "a mapping"
