"""The causes a window can be tagged with: defined in gpufeed.vocabulary, importable here."""

from __future__ import annotations

from gpufeed.vocabulary import Cause

__all__ = ["Cause"]
