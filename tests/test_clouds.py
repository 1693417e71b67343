"""The per-cloud facts table (rubberband/clouds.py): one answer per question, whoever asks."""

from __future__ import annotations

import pytest

from rubberband.catalog import head_types
from rubberband.clouds import CLOUDS, cloud
from rubberband.errors import InputError


@pytest.mark.parametrize(
    "name, zone, region",
    [
        ("aws", "us-east-1a", "us-east-1"),
        ("aws", "ap-northeast-1d", "ap-northeast-1"),
        ("aws", "us-east-1", "us-east-1"),  # a region is its own region
        ("aws", "us-east-1*", "us-east-1*"),  # a trace aggregate is no zone
        ("gcp", "us-central1-a", "us-central1"),
        ("gcp", "europe-west4-b", "europe-west4"),
        ("gcp", "us-central1", "us-central1"),
        ("local", "local", "local"),
    ],
)
def test_a_zone_names_its_region_one_way(name, zone, region):
    assert cloud(name).region_of(zone) == region


def test_metadata_and_notices_come_from_one_server_per_cloud():
    assert cloud("aws").notice_url == "http://169.254.169.254/"
    assert cloud("gcp").notice_url == "http://metadata.google.internal/computeMetadata/v1/"
    assert cloud("local").notice_url is None and cloud("local").metadata_url is None


def test_heads_exist_where_a_cloud_runs_one_and_unknown_clouds_are_refused():
    assert set(head_types()) == {"aws", "gcp"} and head_types()["aws"].name == "m6i.large"
    assert all(d.name == name for name, d in CLOUDS.items())
    with pytest.raises(InputError, match="unknown cloud 'azure'.*aws, gcp, local"):
        cloud("azure")
