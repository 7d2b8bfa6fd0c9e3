"""Network sub-cause accuracy on labelled traces (`make bench-correlator`).

bench/correlator_scenarios.build_network generates nodes that live through every network
guise (a saturated link, a congested InfiniBand or RoCE fabric, a flapping link, a link
that corrupts packets, a peer that holds the job back while this node's links are fine)
beside other causes and confounders. Each trace is analysed by `gpufeed analyze`'s engine
and the windows' `network_reason` is scored against the labels, time-weighted per GPU (a
`straggler` window counts as `peer`: the cause the victims of a late peer get where the
ranks report their collective waits):
precision and recall per reason, their macro-F1 (goal >= 0.90), and the cause-level
macro-F1 on the same traces (the reason must not cost the cause anything). Reported for
both guises of a GPU whose rank waits in a collective (bench/nvml_reading.py: NCCL's
spinning kernel reads busy, the default; the compute-only reading); `--guise` picks one.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from bench import correlator_scenarios as cs
from bench import nvml_reading as nvml
from bench.correlator_accuracy import score
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.trace.reader import read_trace
from gpufeed.vocabulary import NetworkReason

REASONS = tuple(r.value for r in NetworkReason)
GOAL_MACRO_F1 = 0.90

Interval = tuple[float, float, str]


def _by_gpu(
    items: list[tuple[str, str, float, float, str]],
) -> dict[tuple[str, str], list[Interval]]:
    out: dict[tuple[str, str], list[Interval]] = {}
    for inst, gpu, s, e, what in items:
        out.setdefault((inst, gpu), []).append((s, e, what))
    return out


def score_reasons(
    truth: list[tuple[str, str, float, float, str]], pred: list[tuple[str, str, float, float, str]]
) -> dict[str, object]:
    """Per-reason precision/recall/F1 over GPU time; `truth` and `pred` hold (instance, gpu,
    start, end, reason) of network labels and network windows only."""
    t_by, p_by = _by_gpu(truth), _by_gpu(pred)
    tp: dict[str, float] = {}
    truth_t: dict[str, float] = {}
    pred_t: dict[str, float] = {}
    confusion: dict[str, float] = {}
    for key in set(t_by) | set(p_by):
        for s, e, r in t_by.get(key, []):
            truth_t[r] = truth_t.get(r, 0.0) + e - s
        for s, e, r in p_by.get(key, []):
            pred_t[r] = pred_t.get(r, 0.0) + e - s
        for s1, e1, r1 in t_by.get(key, []):
            for s2, e2, r2 in p_by.get(key, []):
                d = min(e1, e2) - max(s1, s2)
                if d <= 0:
                    continue
                if r1 == r2:
                    tp[r1] = tp.get(r1, 0.0) + d
                else:
                    confusion[f"{r1}->{r2}"] = confusion.get(f"{r1}->{r2}", 0.0) + d
    per: dict[str, dict[str, float]] = {}
    f1s: list[float] = []
    for r in REASONS:
        p = tp.get(r, 0.0) / pred_t[r] if pred_t.get(r) else 0.0
        rc = tp.get(r, 0.0) / truth_t[r] if truth_t.get(r) else 0.0
        f1 = 2 * p * rc / (p + rc) if p + rc else 0.0
        per[r] = {"precision": p, "recall": rc, "f1": f1, "truth_s": truth_t.get(r, 0.0)}
        if truth_t.get(r):
            f1s.append(f1)
    return {
        "per_reason": per,
        "macro_f1": sum(f1s) / len(f1s) if f1s else 0.0,
        "confusion": {k: round(v) for k, v in sorted(confusion.items()) if v > 1},
    }


def run(
    seeds: list[int], nodes: int, hours: float, interval: float, guise: str = nvml.SPIN
) -> dict[str, object]:
    labels: list[cs.Label] = []
    windows: list[tuple[str, str, float, float, str, str]] = []
    span: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        for seed in seeds:
            text, labs = cs.build_network(
                seed, nodes=nodes, hours=hours, interval=interval, collectives=guise
            )
            path = os.path.join(d, f"net-{seed}.om")
            with open(path, "w") as f:
                f.write(text)
            tr = read_trace(path)
            ws = analyze_nodes(tr.nodes.values(), WindowParams())
            for n in tr.nodes.values():
                s = next(iter(n.gpus.values())).fields["up"]
                span[f"{seed}/{n.instance}"] = (s.ts[0], s.ts[-1])
            labels += [
                cs.Label(f"{seed}/{x.instance}", x.gpu, x.start, x.end, x.cause, x.network_reason)
                for x in labs
            ]
            windows += [
                (
                    f"{seed}/{w.instance}",
                    w.gpu,
                    w.start_seconds,
                    w.end_seconds,
                    w.cause.value,
                    w.network_reason,
                )
                for w in ws
            ]
    res = score_reasons(
        [(x.instance, x.gpu, x.start, x.end, x.network_reason) for x in labels if x.network_reason],
        [(i, g, s, e, r) for i, g, s, e, c, r in windows if c == "network"]
        # a victim of a late peer is a straggler window where the ranks report their waits
        + [(i, g, s, e, "peer") for i, g, s, e, c, _ in windows if c == "straggler"],
    )
    causes = score(labels, [w[:5] for w in windows], span)
    res["cause_macro_f1"] = causes["macro_f1"]
    res["cause_network"] = causes["per_cause"]["network"]  # type: ignore[index]
    res["cause_straggler"] = causes["per_cause"]["straggler"]  # type: ignore[index]
    res["healthy_in_window_ratio"] = causes["healthy_in_window_ratio"]
    res["cause_confusion"] = causes["confusion"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="*", default=[5, 6, 7])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--guise", choices=nvml.GUISES, help="only this guise (default: both)")
    a = ap.parse_args()
    ok = True
    for guise in (a.guise,) if a.guise else nvml.GUISES:
        res = run(a.seeds, a.nodes, a.hours, a.interval, guise)
        print(
            f"network sub-cause accuracy, collectives {guise}: seeds {a.seeds}, {a.nodes}"
            f" nodes x {a.hours} h at {a.interval} s"
        )
        ok = _report(res) and ok
    return 0 if ok else 1


def _report(res: dict[str, object]) -> bool:
    """Prints one run's figures; whether they meet the goal."""
    print(f"{'reason':<13}{'precision':>10}{'recall':>10}{'F1':>8}{'truth s':>10}")
    per = res["per_reason"]
    assert isinstance(per, dict)
    for r, m in per.items():
        print(
            f"{r:<13}{m['precision']:>10.3f}{m['recall']:>10.3f}{m['f1']:>8.3f}{m['truth_s']:>10.0f}"
        )
    macro = float(res["macro_f1"])  # type: ignore[arg-type]
    print(f"network sub-cause macro-F1 {macro:.3f} (goal >= {GOAL_MACRO_F1:.2f})")
    print(f"confusions (truth->window, GPU-seconds): {res['confusion']}")
    net = res["cause_network"]
    assert isinstance(net, dict)
    print(
        f"on the same traces: cause macro-F1 {float(res['cause_macro_f1']):.3f},"  # type: ignore[arg-type]
        f" network precision {net['precision']:.3f} recall {net['recall']:.3f},"
        f" healthy GPU time in a window {float(res['healthy_in_window_ratio']) * 100:.2f}%"  # type: ignore[arg-type]
    )
    print(f"cause confusions (truth->window, GPU-seconds): {res['cause_confusion']}")
    return macro >= GOAL_MACRO_F1


if __name__ == "__main__":
    raise SystemExit(main())
