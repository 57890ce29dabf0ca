"""deploy/prefect.yaml's schedules become Prefect schedules: an interval's anchor_date sets when its ticks start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.deploy_module import deployments_module


def test_an_interval_schedule_starts_its_ticks_at_its_anchor_date() -> None:
    d = deployments_module()
    s = d.schedule_of({"interval": 90, "anchor_date": "2026-12-04T02:00:00+00:00", "slug": "s"}, None, "here", None)
    assert s.interval == timedelta(seconds=90)
    assert s.anchor_date == datetime(2026, 12, 4, 2, tzinfo=UTC)
    plain = d.schedule_of({"interval": 90}, None, "here", None)
    assert plain.anchor_date != s.anchor_date  # Prefect's own default, not ours


def test_an_anchor_date_that_is_not_a_date_is_refused_naming_the_schedule() -> None:
    d = deployments_module()
    with pytest.raises(d.SpecError, match=r"deploy/prefect.yaml: pipeline.*anchor_date must be an ISO 8601"):
        d.schedule_of({"interval": 90, "anchor_date": "tomorrow"}, None, "deploy/prefect.yaml: pipeline", None)
