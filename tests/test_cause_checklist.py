"""Adding a cause is the enum (gpufeed.vocabulary.Cause), its rules and its runbook; this
names every other piece a cause needs that is still missing.

For each cause: rules that can decide it (correlator/engine/rules.py; `unknown` has none), the
words of its window summary (correlator/engine/summary.py) and of a victim's summary
naming it as its culprit's cause (correlator/job/culprit.py), a bullet in the GpuUtilizationLow
runbook and in its `cause` label list (docs/runbooks.md), a row of the causes table
(docs/correlator.md), a colour on the dashboards (dashboards/presets.py), an on-call hint
in the alert's description (alerts/config.py), a routing decision tested through amtool
(tests/test_compose.py ROUTES, for compose/alertmanager/alertmanager.yml), and a simulator
phase that produces it (gpufeed/simulate/scenario.py; not `unknown`).
"""

from __future__ import annotations

import re

from alerts import config as alerts_config
from dashboards import presets
from gpufeed.correlator.engine.rules import RULES
from gpufeed.correlator.engine.summary import HEADLINES
from gpufeed.correlator.job.culprit import CULPRIT_WORDS
from gpufeed.simulate.scenario import PHASES
from gpufeed.vocabulary import Cause
from stack_support import REPO_ROOT
from test_compose import ROUTES

RUNBOOKS = REPO_ROOT / "docs" / "runbooks.md"
CORRELATOR_DOC = REPO_ROOT / "docs" / "correlator.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def missing_pieces(cause: str) -> list[str]:
    """What `cause` still lacks, one line per piece naming where it goes."""
    missing: list[str] = []
    decidable = cause != Cause.UNKNOWN
    if decidable and not any(r.cause == cause for r in RULES):
        missing.append("rules: no Rule for it in gpufeed/correlator/engine/rules.py RULES")
    if cause not in HEADLINES:
        missing.append("summary: no headline in gpufeed/correlator/engine/summary.py HEADLINES")
    if cause not in CULPRIT_WORDS:
        missing.append(
            "culprit: no words in gpufeed/correlator/job/culprit.py CULPRIT_WORDS (a victim's "
            "summary names its culprit's cause)"
        )
    runbook = _section(RUNBOOKS.read_text(encoding="utf-8"), "## GpuUtilizationLow")
    if not re.search(rf"^- `{re.escape(cause)}`: ", runbook, re.MULTILINE):
        missing.append(
            "runbook: no '- `cause`:' bullet under GpuUtilizationLow in docs/runbooks.md"
        )
    labels = runbook.split("**Labels**", 1)[1].split("\n\n", 1)[0]
    if f"`{cause}`" not in labels:
        missing.append("runbook: not in the `cause` label list of GpuUtilizationLow")
    table = _section(CORRELATOR_DOC.read_text(encoding="utf-8"), "## Causes")
    if not re.search(rf"^\| `{re.escape(cause)}` \|", table, re.MULTILINE):
        missing.append("docs: no row in the causes table of docs/correlator.md")
    if cause not in presets.CAUSE_COLOURS:
        missing.append("dashboards: no colour in dashboards/presets.py CAUSE_COLOURS")
    if cause not in alerts_config.CAUSE_HINTS:
        missing.append("alerts: no hint in alerts/config.py CAUSE_HINTS")
    if ("GpuUtilizationLow", cause) not in ROUTES:
        missing.append(
            "alertmanager: no receiver for GpuUtilizationLow with this cause in "
            "tests/test_compose.py ROUTES (route it in compose/alertmanager/alertmanager.yml "
            "or let it fall through to on-call)"
        )
    if decidable and cause not in PHASES:
        missing.append("simulator: no phase in gpufeed/simulate/scenario.py PHASES")
    return missing


def test_every_cause_has_every_piece() -> None:
    report = {c.value: m for c in Cause if (m := missing_pieces(c.value))}
    assert report == {}


def test_a_new_cause_is_told_what_it_lacks() -> None:
    """A cause that exists only as a name lacks everything, and each piece is named."""
    got = missing_pieces("fan_failure")
    pieces = [line.split(":", 1)[0] for line in got]
    assert pieces == [
        "rules",
        "summary",
        "culprit",
        "runbook",
        "runbook",
        "docs",
        "dashboards",
        "alerts",
        "alertmanager",
        "simulator",
    ], got


def test_no_piece_knows_a_cause_the_enum_does_not() -> None:
    causes = {c.value for c in Cause}
    assert set(HEADLINES) <= causes
    assert set(CULPRIT_WORDS) <= causes
    assert set(presets.CAUSE_COLOURS) == causes
    assert set(alerts_config.CAUSE_HINTS) == causes
    assert {c for n, c in ROUTES if n == "GpuUtilizationLow"} == causes
    assert set(PHASES) - {"compute"} == causes - {Cause.UNKNOWN}
