from pathlib import Path

import pytest

from gpufeed.config import AgentConfig, ConfigError, load_config, parse_config

GOOD = """
interval_seconds: 2
tiers:
  hot: ["/mnt/nvme"]
  warm: ["/mnt/datasets/", /mnt/more]
correlator:
  threshold_ratio: 0.7
sdk:
  socket_path: /tmp/x.sock
"""


def test_good_config_parses_into_frozen_dataclasses() -> None:
    cfg = parse_config(GOOD)
    assert cfg.interval_seconds == 2.0
    assert [(t.name, t.paths) for t in cfg.tiers] == [
        ("hot", ("/mnt/nvme",)),
        ("warm", ("/mnt/datasets", "/mnt/more")),
    ]
    assert cfg.correlator.threshold_ratio == 0.7
    assert cfg.correlator.min_window_seconds == 60.0
    assert cfg.sdk.socket_path == "/tmp/x.sock"
    with pytest.raises(AttributeError):
        cfg.interval_seconds = 5  # type: ignore[misc]


def test_empty_file_and_no_file_give_defaults(tmp_path: Path) -> None:
    assert parse_config("") == AgentConfig()
    assert load_config(None) == AgentConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("interval_seconds: fast\n", r"line 1: interval_seconds: expected a number, got 'fast'"),
        ("interval_seconds: 0\n", r"line 1: interval_seconds: must be between"),
        ("\n\nintervall_seconds: 1\n", r"line 3: intervall_seconds: unknown key"),
        (
            "tiers:\n  hot: nvme\n",
            r"line 2: tiers.hot: expected an absolute path or s3://BUCKET\[/PREFIX\], got 'nvme'",
        ),
        ("tiers:\n  Hot: [/a]\n", r"line 2: tiers.Hot: tier names are lower-case"),
        (
            "tiers:\n  hot: [/a]\n  warm: [/a/]\n",
            r"line 3: tiers.warm: /a is already in tier 'hot'",
        ),
        ("tiers:\n  hot: []\n", r"line 2: tiers.hot: a tier needs at least one path"),
        ("tiers: [/a]\n", r"line 1: tiers: expected a mapping"),
        ("interval_seconds: [1\n", r"line 2: invalid YAML"),
        ("correlator:\n  threshold: 0.5\n", r"line 2: correlator.threshold: unknown key"),
        ("sdk:\n  max_jobs: 1.5\n", r"line 2: sdk.max_jobs: expected an integer"),
        ("- a\n- b\n", r"config: expected a mapping"),
    ],
)
def test_bad_config_names_key_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, "agent.yaml")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_instance_setting_flag_wins_over_config_over_the_default_rule() -> None:
    import socket

    from gpufeed.agent.command import node_instance

    assert parse_config("instance: node-07:9842\n").instance == "node-07:9842"
    assert parse_config("interval_seconds: 1\n").instance == ""
    assert node_instance(None, "", 9842) == f"{socket.gethostname()}:9842"
    assert node_instance(None, "node-07:9842", 1) == "node-07:9842"
    assert node_instance("a:1", "node-07:9842", 1) == "a:1"


def test_network_settings_reach_the_network_collector() -> None:
    """Virtual interfaces are a config key wired to the collector the agent builds."""
    from gpufeed.agent import wiring
    from gpufeed.collectors.base import CollectorContext
    from gpufeed.hostpaths import HostPaths

    fixture = Path(__file__).parent / "fixtures" / "network"
    host = HostPaths(procfs=fixture / "proc", sysfs=fixture / "sys", rootfs=fixture)
    spec = wiring.spec("network")

    def devices(text: str) -> set[str]:
        collector = spec.build(wiring.Wiring(CollectorContext(host, parse_config(text))))
        assert collector is not None
        return {dict(s.labels).get("device", "") for f in collector.collect() for s in f.samples}

    def wait_seconds(text: str) -> float:
        collector = spec.build(wiring.Wiring(CollectorContext(host, parse_config(text))))
        assert collector is not None
        wait = "gpufeed_network_transmit_wait_seconds_total"
        return sum(s.value for f in collector.collect() for s in f.samples if s.name == wait)

    assert "veth3f2a1b0" not in devices("")
    assert "veth3f2a1b0" in devices("network:\n  include_virtual: true\n")
    default = wait_seconds("")
    assert default > 0
    assert wait_seconds("network:\n  xmit_wait_tick_bytes: 32\n") == pytest.approx(4 * default)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("network:\n  include_virtual: 1\n", r"line 2: network.include_virtual: expected true"),
        ("network:\n  xmit_wait_tick_bytes: 0\n", r"line 2: network.xmit_wait_tick_bytes: must"),
        ("network:\n  xmit_wait: 8\n", r"line 2: network.xmit_wait: unknown key"),
    ],
)
def test_bad_network_settings_name_key_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, "agent.yaml")
