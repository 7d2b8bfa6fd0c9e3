import math

import pytest

from gpufeed.model import Families


def test_absent_values_are_dropped_not_zeroed() -> None:
    f = Families()
    f.gauge("gpufeed_x_ratio", "x", {"gpu": "0"}, None)
    f.gauge("gpufeed_x_ratio", "x", {"gpu": "1"}, math.nan)
    f.gauge("gpufeed_x_ratio", "x", {"gpu": "2"}, 0.0)
    (fam,) = f.build()
    assert [s.label("gpu") for s in fam.samples] == ["2"]
    assert fam.samples[0].value == 0.0


def test_counter_needs_total_suffix() -> None:
    with pytest.raises(ValueError, match="_total"):
        Families().counter("gpufeed_bytes", "x", {}, 1)


def test_histogram_adds_inf_bucket_sum_and_count() -> None:
    f = Families()
    f.histogram("gpufeed_h_seconds", "h", {"job_id": "a"}, [(1.0, 2), (5.0, 3)], 7.5, 4)
    (fam,) = f.build()
    names = [(s.name, s.label("le")) for s in fam.samples]
    assert names == [
        ("gpufeed_h_seconds_bucket", "1.0"),
        ("gpufeed_h_seconds_bucket", "5.0"),
        ("gpufeed_h_seconds_bucket", "+Inf"),
        ("gpufeed_h_seconds_sum", ""),
        ("gpufeed_h_seconds_count", ""),
    ]
    assert fam.samples[2].value == 4
