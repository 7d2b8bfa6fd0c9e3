"""A test that cannot run here skips outside CI and fails in CI (tests/host_needs.py)."""

from __future__ import annotations

import pytest

from host_needs import missing


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_in_ci_a_missing_requirement_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=r"needs /dev/fuse; CI is set"):
        missing("needs /dev/fuse")


@pytest.mark.parametrize("value", [None, "", "false"])
def test_outside_ci_it_skips(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match=r"needs /dev/fuse"):
        missing("needs /dev/fuse")
