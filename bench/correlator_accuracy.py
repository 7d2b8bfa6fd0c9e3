"""Accuracy of the correlator on labelled multi-node traces (`make bench-correlator`).

Generates traces with bench/correlator_scenarios.py (every cause in more than one guise,
with and without SDK signals, per-job tier I/O on some nodes, confounders), writes each
as a trace file, runs `gpufeed analyze`'s engine on it and scores the windows against the
labels, time-weighted per GPU: per cause precision and recall, macro-F1, and the share of
healthy GPU time that fell inside a window. Every figure is reported for both guises of a
GPU whose rank waits in a collective (bench/nvml_reading.py: NCCL's spinning kernel reads
busy, the default; the compute-only reading, as on gloo); `--guise` picks one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from bench import correlator_scenarios as cs
from bench import nvml_reading as nvml
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.trace.reader import read_trace


def _intervals_by_gpu(
    items: list[tuple[str, str, float, float, str]],
) -> dict[tuple[str, str], list[tuple[float, float, str]]]:
    out: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for inst, gpu, s, e, c in items:
        out.setdefault((inst, gpu), []).append((s, e, c))
    return out


def _overlap(
    a: list[tuple[float, float, str]], b: list[tuple[float, float, str]]
) -> dict[tuple[str, str], float]:
    """Time where a's cause x meets b's cause y, for every (x, y)."""
    out: dict[tuple[str, str], float] = {}
    for s1, e1, c1 in a:
        for s2, e2, c2 in b:
            d = min(e1, e2) - max(s1, s2)
            if d > 0:
                out[(c1, c2)] = out.get((c1, c2), 0.0) + d
    return out


def score(
    labels: list[cs.Label],
    windows: list[tuple[str, str, float, float, str]],
    span: dict[str, tuple[float, float]],
    n_gpus: int = 8,
) -> dict[str, object]:
    truth = _intervals_by_gpu([(x.instance, x.gpu, x.start, x.end, x.cause) for x in labels])
    pred = _intervals_by_gpu(windows)
    tp: dict[str, float] = {}
    truth_t: dict[str, float] = {}
    pred_t: dict[str, float] = {}
    healthy_in_window = 0.0
    total_truth = 0.0
    conf: dict[tuple[str, str], float] = {}
    for key in set(truth) | set(pred):
        tr = truth.get(key, [])
        pr = pred.get(key, [])
        for s, e, c in tr:
            truth_t[c] = truth_t.get(c, 0.0) + e - s
            total_truth += e - s
        for s, e, c in pr:
            pred_t[c] = pred_t.get(c, 0.0) + e - s
        ov = _overlap(tr, pr)
        covered: dict[str, float] = {}
        for (_c1, c2), d in ov.items():
            covered[c2] = covered.get(c2, 0.0) + d
        for s, e, c in pr:  # window time outside every label: healthy time
            conf[("healthy", c)] = conf.get(("healthy", c), 0.0) + (e - s)
        for c2, d in covered.items():
            conf[("healthy", c2)] -= d
        for (c1, c2), d in ov.items():
            conf[(c1, c2)] = conf.get((c1, c2), 0.0) + d
            if c1 == c2:
                tp[c1] = tp.get(c1, 0.0) + d
        in_truth = sum(ov.values())
        healthy_in_window += sum(e - s for s, e, _ in pr) - in_truth
    total_gpu_time = sum((e - s) * n_gpus for s, e in span.values())
    healthy_time = total_gpu_time - total_truth
    per: dict[str, dict[str, float]] = {}
    f1s = []
    for c in cs.CAUSES:
        p = tp.get(c, 0.0) / pred_t[c] if pred_t.get(c) else 0.0
        r = tp.get(c, 0.0) / truth_t[c] if truth_t.get(c) else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        per[c] = {
            "precision": p,
            "recall": r,
            "f1": f1,
            "truth_s": truth_t.get(c, 0.0),
            "pred_s": pred_t.get(c, 0.0),
        }
        if truth_t.get(c):
            f1s.append(f1)
    return {
        "per_cause": per,
        "macro_f1": sum(f1s) / len(f1s) if f1s else 0.0,
        "healthy_in_window_ratio": healthy_in_window / healthy_time if healthy_time else 0.0,
        "unknown_s": pred_t.get("unknown", 0.0),
        "confusion": {
            f"{a}->{b}": round(v) for (a, b), v in sorted(conf.items()) if a != b and v > 1
        },
    }


def run(
    seeds: list[int],
    nodes: int,
    hours: float,
    interval: float,
    jobs: int,
    guise: str = nvml.SPIN,
) -> dict[str, object]:
    all_labels: list[cs.Label] = []
    all_windows: list[tuple[str, str, float, float, str]] = []
    span: dict[str, tuple[float, float]] = {}
    samples = 0
    t_an = 0.0
    with tempfile.TemporaryDirectory() as d:
        for seed in seeds:
            text, labels = cs.build(
                seed, nodes=nodes, hours=hours, interval=interval, collectives=guise
            )
            path = os.path.join(d, f"trace-{seed}.om")
            with open(path, "w") as f:
                f.write(text)
            t0 = time.perf_counter()
            tr = read_trace(path, jobs=jobs)
            ws = analyze_nodes(tr.nodes.values(), WindowParams(), jobs=jobs)
            t_an += time.perf_counter() - t0
            samples += tr.samples
            for n in tr.nodes.values():
                g = next(iter(n.gpus.values()))
                s = g.fields["up"]
                span[f"{seed}/{n.instance}"] = (s.ts[0], s.ts[-1])
            all_labels += [
                cs.Label(f"{seed}/{x.instance}", x.gpu, x.start, x.end, x.cause) for x in labels
            ]
            all_windows += [
                (f"{seed}/{w.instance}", w.gpu, w.start_seconds, w.end_seconds, w.cause.value)
                for w in ws
            ]
    res = score(all_labels, all_windows, span)
    res["samples"] = samples
    res["analysis_seconds"] = t_an
    return res


def run_external(trace: str, labels_path: str, jobs: int) -> dict[str, object]:
    """Scores a trace labelled elsewhere: JSON lines with instance, gpu, start, end and
    cause (null while healthy), e.g. from `python -m gpufeed.simulate.tracegen`."""
    import json

    labels: list[cs.Label] = []
    span: dict[str, tuple[float, float]] = {}
    gpus: dict[str, set[str]] = {}
    with open(labels_path) as f:
        for line in f:
            d = json.loads(line)
            inst = d["instance"]
            lo, hi = span.get(inst, (d["start"], d["end"]))
            span[inst] = (min(lo, d["start"]), max(hi, d["end"]))
            gpus.setdefault(inst, set()).add(d["gpu"])
            if d.get("cause"):
                labels.append(cs.Label(inst, d["gpu"], d["start"], d["end"], d["cause"]))
    t0 = time.perf_counter()
    tr = read_trace(trace, jobs=jobs)
    ws = analyze_nodes(tr.nodes.values(), WindowParams(), jobs=jobs)
    dt = time.perf_counter() - t0
    n_gpus = max(len(g) for g in gpus.values())
    found = [(w.instance, w.gpu, w.start_seconds, w.end_seconds, w.cause.value) for w in ws]
    res = score(labels, found, span, n_gpus)
    res["samples"] = tr.samples
    res["analysis_seconds"] = dt
    return res


SIM_CONFIGS = (  # (seed, nodes, hours, step seconds, sdk)
    (1, 4, 2.0, 15.0, None),
    (2, 4, 2.0, 5.0, False),
    (3, 4, 4.0, 15.0, True),
    (4, 2, 1.0, 1.0, None),
)


def simulated(jobs: int, guises: tuple[str, ...]) -> bool:
    """Scores traces from the simulated node's own labelled generator (another model), in
    each guise of a collective wait (its COLLECTIVE_GUISES are the same two)."""
    from gpufeed.simulate.tracegen import generate_trace, random_scenarios

    ok = True
    for guise in guises:
        print(f"\non traces of gpufeed.simulate.tracegen, collectives {guise}"
              " (seed, nodes, hours, step, sdk):")  # fmt: skip
        with tempfile.TemporaryDirectory() as d:
            for seed, nodes, hours, step, sdk in SIM_CONFIGS:
                trace, labels = os.path.join(d, "t.om"), os.path.join(d, "t.labels.jsonl")
                generate_trace(
                    trace, labels, nodes=nodes, duration_s=hours * 3600, step_s=step,
                    seed=seed, scenario=random_scenarios(sdk, guise),
                )  # fmt: skip
                res = run_external(trace, labels, jobs)
                hw = float(res["healthy_in_window_ratio"])
                print(
                    f"  {seed} {nodes} {hours:g}h {step:g}s sdk={sdk}: macro-F1"
                    f" {float(res['macro_f1']):.3f}, healthy in a window {hw * 100:.2f}%,"
                    f" confusions {res['confusion']}"
                )
                ok = ok and float(res["macro_f1"]) >= 0.95 and hw <= 0.02
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="*", default=[11, 22, 33])
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument(
        "--simulated",
        action="store_true",
        help="also score traces of the project's simulated node (gpufeed.simulate.tracegen)",
    )
    ap.add_argument("--trace", help="score this externally labelled trace instead")
    ap.add_argument("--labels", help="its JSON-lines labels (with --trace)")
    ap.add_argument("--guise", choices=nvml.GUISES, help="only this guise (default: both)")
    a = ap.parse_args()
    if a.trace:
        res = run_external(a.trace, a.labels, a.jobs)
        print(f"correlator accuracy on {a.trace}: {res['samples']} samples")
        return 0 if _report(res) else 1
    guises = (a.guise,) if a.guise else nvml.GUISES
    ok = True
    for guise in guises:
        res = run(a.seeds, a.nodes, a.hours, a.interval, a.jobs, guise)
        print(
            f"correlator accuracy, collectives {guise}: seeds {a.seeds}, {a.nodes} nodes x"
            f" {a.hours} h at {a.interval} s, {res['samples']} samples"
        )
        ok = _report(res) and ok
    if a.simulated:
        ok = simulated(a.jobs, guises) and ok
    return 0 if ok else 1


def _report(res: dict[str, object]) -> bool:
    """Prints one run's figures; whether they meet the goals."""
    print(f"{'cause':<15}{'precision':>10}{'recall':>10}{'F1':>8}{'truth s':>10}{'window s':>10}")
    per = res["per_cause"]
    assert isinstance(per, dict)
    for c, m in per.items():
        print(
            f"{c:<15}{m['precision']:>10.3f}{m['recall']:>10.3f}{m['f1']:>8.3f}{m['truth_s']:>10.0f}{m['pred_s']:>10.0f}"
        )
    print(f"macro-F1 {res['macro_f1']:.3f} (goal >= 0.95)")
    print(
        f"healthy GPU time inside a window {float(res['healthy_in_window_ratio']) * 100:.2f}% (goal <= 2%)"
    )
    print(f"windows tagged unknown: {float(res['unknown_s']):.0f} GPU-seconds")
    print(f"confusions (truth->window, GPU-seconds): {res['confusion']}")
    print(f"analysis: {res['samples']} samples in {float(res['analysis_seconds']):.1f} s")
    return float(res["macro_f1"]) >= 0.95 and float(res["healthy_in_window_ratio"]) <= 0.02


if __name__ == "__main__":
    raise SystemExit(main())
