"""A network window's sub-cause (`network_reason`) and the counters that decided it."""

from __future__ import annotations

from pathlib import Path

import pytest

from correlator_helpers import analyze_text, scenarios
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.netreason import (
    REASON_FEATURES,
    REASON_NEUTRAL,
    deciding_counters,
    network_reason,
)
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.rules import RULES_BY_CAUSE
from gpufeed.correlator.engine.summary import NETWORK_REASON_WORDS
from gpufeed.correlator.engine.window import Window
from gpufeed.sysfs.infiniband import IB_ERROR_COUNTERS
from gpufeed.sysfs.netclass import ETHERNET_ERROR_COUNTERS
from gpufeed.vocabulary import LINK_FLAP_COUNTERS, Cause, NetworkReason

R = NetworkReason


def test_every_network_feature_belongs_to_one_reason() -> None:
    owners: dict[str, list[NetworkReason]] = {}
    for reason, features in REASON_FEATURES.items():
        for name in features:
            owners.setdefault(name, []).append(reason)
    network = {r.feature for r in RULES_BY_CAUSE[Cause.NETWORK]}
    assert sorted(network - set(owners) - set(REASON_NEUTRAL)) == [], "a rule without a reason"
    assert {k: v for k, v in owners.items() if len(v) > 1} == {}
    assert set(owners) <= network, "a reason reads a feature no network rule scores"
    assert set(REASON_FEATURES) == set(NetworkReason)


def test_flap_counters_are_counters_the_collector_exports() -> None:
    exported = {n for n, _ in IB_ERROR_COUNTERS} | {
        rel.rsplit("/", 1)[-1] for rel in ETHERNET_ERROR_COUNTERS
    }
    assert set(LINK_FLAP_COUNTERS) <= exported


@pytest.mark.parametrize(
    ("evidence", "reason"),
    [
        ({F.NETWORK_UTILIZATION_RATIO: 0.96}, R.SATURATED),
        # a shaped link at 85% of its rate while the ranks here wait in collectives
        ({F.NETWORK_BUSY_IN_COLLECTIVES_RATIO: 0.85}, R.SATURATED),
        ({F.NVLINK_PEAK_RATIO: 0.99}, R.SATURATED),
        ({F.NETWORK_TRANSMIT_WAIT_X_BASELINE: 12.0}, R.CONGESTION),
        ({F.NETWORK_CONGESTION_PACKETS_X_BASELINE: 40.0}, R.CONGESTION),
        ({F.NETWORK_LINK_FLAPS: 2.0}, R.LINK_ERRORS),
        ({F.NETWORK_LINK_DOWN: 1.0}, R.LINK_ERRORS),
        ({F.NETWORK_LINK_ERRORS_PER_SECOND: 30.0}, R.LINK_ERRORS),
        ({F.SDK_COMMUNICATION_SHARE: 0.6}, R.PEER),
        # a full link also runs out of credits: still saturated, not congested
        (
            {F.NETWORK_UTILIZATION_RATIO: 0.95, F.NETWORK_TRANSMIT_WAIT_X_BASELINE: 20.0},
            R.SATURATED,
        ),
        # a flapping link leaves traffic waiting for credits: the fault is the reason
        ({F.NETWORK_LINK_FLAPS: 1.0, F.NETWORK_TRANSMIT_WAIT_X_BASELINE: 20.0}, R.LINK_ERRORS),
        ({F.NETWORK_LINK_FLAPS: 1.0, F.NETWORK_UTILIZATION_RATIO: 0.97}, R.LINK_ERRORS),
        # the job waits in collectives, but this node's link shows something: not a peer
        ({F.SDK_COMMUNICATION_SHARE: 0.8, F.NETWORK_TRANSMIT_WAIT_X_BASELINE: 4.0}, R.CONGESTION),
        # weak local evidence only: the strongest local reason, never `peer`
        (
            {F.NETWORK_LINK_ERRORS_PER_SECOND: 0.3, F.NETWORK_TRANSMIT_WAIT_X_BASELINE: 4.0},
            R.CONGESTION,
        ),
        ({}, R.PEER),
        ({F.NETWORK_THROUGHPUT_DROP_RATIO: 0.7}, R.PEER),
    ],
)
def test_network_reason_from_evidence(evidence: dict[str, float], reason: NetworkReason) -> None:
    assert network_reason(evidence) is reason


def _counter_node() -> NodeSeries:
    node = NodeSeries("n:9400")
    ib = {"device": "mlx5_0", "port": "1", "fabric": "infiniband"}
    eth = {"device": "eth0", "fabric": "ethernet"}
    rows = [
        ("gpufeed_network_link_errors_total", {**ib, "counter": "link_downed"}, (1, 1, 3, 4)),
        ("gpufeed_network_link_errors_total", {**ib, "counter": "symbol_error"}, (5, 5, 900, 1205)),
        ("gpufeed_network_link_errors_total", {**ib, "counter": "port_rcv_errors"}, (0, 0, 0, 0)),
        (
            "gpufeed_network_congestion_packets_total",
            {**ib, "counter": "port_xmit_discards"},
            (0, 10, 20, 40),
        ),
        ("gpufeed_network_transmit_wait_seconds_total", ib, (1.0, 1.5, 6.0, 9.5)),
        ("gpufeed_network_link_errors_total", {**eth, "counter": "carrier_changes"}, (2, 2, 2, 4)),
        # the management link waits a little too: too little to be named
        ("gpufeed_network_transmit_wait_seconds_total", eth, (0.0, 0.1, 0.2, 0.3)),
    ]
    for name, labels, values in rows:
        s = node.route(name, labels)
        assert s is not None, name
        for i, v in enumerate(values):
            s.append(1000.0 + 10 * i, float(v))
    return node


def test_deciding_counters_name_what_moved_by_the_kernels_names() -> None:
    node = _counter_node()
    got = deciding_counters(node, R.LINK_ERRORS, 1010.0, 1030.0, "mlx5_0/1")
    assert got == "link_downed +3, symbol_error +1200 on mlx5_0/1; carrier_changes +2 on eth0"
    # the flap lookback reaches before the window: a flap just before it opened counts
    assert "link_downed +3" in deciding_counters(node, R.LINK_ERRORS, 1025.0, 1030.0)
    got = deciding_counters(node, R.CONGESTION, 1010.0, 1030.0, "mlx5_0/1")
    assert got == "port_xmit_discards +30, transmit-wait +8.0 s on mlx5_0/1"
    assert deciding_counters(node, R.SATURATED, 1000.0, 1030.0) == ""
    assert deciding_counters(node, R.PEER, 1000.0, 1030.0) == ""
    assert deciding_counters(NodeSeries("empty"), R.LINK_ERRORS, 0.0, 1.0) == ""


def test_window_json_carries_the_reason_and_reads_it_back() -> None:
    w = Window("n", "0", "GPU-x", "j", 1.0, 2.0, Cause.NETWORK, 0.9, 0.3, (), "s",
               network_reason="link_errors")  # fmt: skip
    d = w.to_json()
    assert d["network_reason"] == "link_errors"
    assert Window.from_json(d) == w
    other = Window("n", "0", "GPU-x", "j", 1.0, 2.0, Cause.IDLE, 0.9, 0.0, (), "s")
    assert "network_reason" not in other.to_json()  # only network windows carry it


GUISES = [
    # (guise, roce, sdk, reason, what the evidence must name)
    ("saturated", False, True, R.SATURATED, None),
    ("congested", False, False, R.CONGESTION, "transmit-wait +"),
    ("congested", True, True, R.CONGESTION, "np_ecn_marked_roce_packets +"),
    ("flapping", False, False, R.LINK_ERRORS, "link_downed +"),
    ("flapping", True, True, R.LINK_ERRORS, "link_downed +"),
    ("link_errors", False, True, R.LINK_ERRORS, "port_rcv_errors +"),
    ("link_errors", True, False, R.LINK_ERRORS, "out_of_sequence +"),
    ("peer", False, True, R.PEER, None),
]


@pytest.mark.parametrize(("guise", "roce", "sdk", "reason", "counter"), GUISES)
def test_one_node_network_guise_gets_its_reason_and_counters(
    guise: str,
    roce: bool,
    sdk: bool,
    reason: NetworkReason,
    counter: str | None,
    tmp_path: Path,
) -> None:
    text, labels = scenarios.single(
        "network", guise, seed=4, sdk=sdk, minutes=35, link_counters=True, roce=roce
    )
    assert {lab.network_reason for lab in labels} == {reason.value}
    windows = analyze_text(text, tmp_path)
    if reason is R.PEER:
        # the ranks report their collective waits: the victims of a late peer are stragglers
        assert {lab.cause for lab in labels} == {"straggler"}
        assert [w.cause for w in windows] == [Cause.STRAGGLER] * len(labels)
        return
    windows = [w for w in windows if w.cause is Cause.NETWORK]
    assert len(windows) == len(labels), [w.summary for w in windows]
    for w in windows:
        ev = dict(w.evidence)
        assert w.network_reason == reason.value
        assert ev[Ctx.NETWORK_REASON] == reason.value
        assert f"held back by the network ({NETWORK_REASON_WORDS[reason]})" in w.summary
        if counter is None:
            assert Ctx.NETWORK_COUNTERS not in ev
        else:
            assert counter in str(ev[Ctx.NETWORK_COUNTERS]), ev
            assert str(ev[Ctx.NETWORK_COUNTERS]) in w.summary


def test_sub_cause_scoring_counts_time_per_reason() -> None:
    from bench.network_accuracy import score_reasons

    truth = [("n", "0", 0.0, 100.0, "peer"), ("n", "1", 0.0, 100.0, "link_errors")]
    exact = score_reasons(truth, truth)
    assert exact["macro_f1"] == 1.0
    # GPU 1's window calls its flapping link congestion for the second half
    pred = [
        ("n", "0", 0.0, 100.0, "peer"),
        ("n", "1", 0.0, 50.0, "link_errors"),
        ("n", "1", 50.0, 100.0, "congestion"),
    ]
    res = score_reasons(truth, pred)
    per = res["per_reason"]
    assert isinstance(per, dict)
    assert per["link_errors"]["recall"] == 0.5 and per["link_errors"]["precision"] == 1.0
    assert per["congestion"]["precision"] == 0.0  # no congestion in the truth: not averaged
    assert res["macro_f1"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert res["confusion"] == {"link_errors->congestion": 50}


@pytest.mark.parametrize(
    ("collective_wait", "data_wait", "cpu_counts"),
    [
        (0.9, 0.02, False),  # waits for peers, not for input: the host's CPUs are not why
        (0.9, 0.4, True),  # waits for input too: the CPUs may well be why
        (0.3, 0.02, True),  # mostly not in collectives: the host's readings stand
        (0.9, None, True),  # no phase report from the job: nothing to go by
    ],
)
def test_host_cpu_does_not_explain_a_job_that_waits_for_peers(
    collective_wait: float, data_wait: float | None, cpu_counts: bool
) -> None:
    from gpufeed.correlator.engine.features import Evidence, _not_waiting_for_input

    ev = Evidence(
        {F.CPU_BUSY_RATIO: 1.0, F.CPU_PRESSURE_RATIO: 0.99, F.JOB_CPU_THROTTLED_RATIO: 0.8}
    )
    if data_wait is not None:
        ev.features[F.SDK_DATA_WAIT_SHARE] = data_wait
    _not_waiting_for_input(ev, collective_wait)
    assert (ev.features[F.CPU_BUSY_RATIO] == 1.0) is cpu_counts
    assert (ev.features[F.CPU_PRESSURE_RATIO] == 0.99) is cpu_counts
    assert ev.features[F.JOB_CPU_THROTTLED_RATIO] == 0.8  # the job's own quota always counts
