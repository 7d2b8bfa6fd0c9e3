"""docs/metrics.md's tables, generated from the metric catalogue.

`python -m gpufeed.catalogue_doc docs/metrics.md` rewrites the part of the file between the
two markers and leaves the prose around it alone; `make docs` runs it, and a test fails when
the committed file differs from what the catalogue gives.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpufeed.catalogue import CATALOGUE, Group, MetricSpec

BEGIN = "<!-- BEGIN generated from exporter/gpufeed/catalogue.py by `make docs` -->"
END = "<!-- END generated -->"

TITLES: dict[Group, str] = {
    "gpu": "GPU",
    "storage": "Storage tiers",
    "network": "Network fabric",
    "host": "Host",
    "jobs": "Jobs and the job SDK",
    "serving": "Inference serving (vLLM, Triton, TGI)",
    "correlator": "Correlator",
    "fleet": "The fleet service (gpufeed fleet)",
    "scheduler": "The cluster's scheduler (gpufeed scheduler, one per cluster)",
    "agent": "The agent's own health",
}


def _labels(m: MetricSpec) -> str:
    return ", ".join(f"`{x}`" + ("?" if x in m.optional_labels else "") for x in m.labels)


def _row(m: MetricSpec) -> str:
    help_ = m.help.replace("|", "\\|")
    contract = "yes" if m.contract else ""
    return f"| `{m.name}` | {m.type} | {_labels(m)} | {contract} | {help_} |"


def render_tables() -> str:
    parts = []
    for group, title in TITLES.items():
        rows = [_row(m) for m in CATALOGUE if m.group == group]
        if not rows:
            continue
        parts.append(
            f"### {title}\n\n"
            "| name | type | labels | contract | meaning (the HELP text) |\n"
            "|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
        )
    return "\n".join(parts)


def rewrite(text: str) -> str:
    """`text` with the generated part replaced; a file without both markers is an error."""
    try:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} must both be in the file") from None
    return f"{head}{BEGIN}\n\n{render_tables()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpufeed.catalogue_doc docs/metrics.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
