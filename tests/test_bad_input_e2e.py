"""A few generated bad inputs through the real entry point (``python -m rubberband`` in a subprocess):
the in-process cases of ``test_bad_input.py`` hold for the command a user runs too."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from test_bad_input import GOOD_PROFILE, SPEC_FREE, SPEC_REQUIRED, broken, good_profile, good_spec, workdir

pytestmark = pytest.mark.e2e  # each example starts the CLI in a subprocess

FEW = settings(
    max_examples=3,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def one_line_refusal(result) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rubberband: error: "), result.stderr[-2000:]
    return lines[0]


@FEW
@given(data=st.data())
def test_a_broken_spec_through_the_real_cli(data, cli):
    bad = data.draw(broken(good_spec(), SPEC_FREE, SPEC_REQUIRED))
    with workdir() as work:
        (work / "job.yaml").write_text(yaml.safe_dump(bad.doc, allow_unicode=True))
        line = one_line_refusal(cli("plan", work / "job.yaml", "--profile", GOOD_PROFILE, "--out", work / "p.json"))
        assert bad.field in line and not (work / "p.json").exists()


@FEW
@given(cut=st.integers(min_value=1, max_value=10**6))
def test_a_truncated_profile_through_the_real_cli(cut, cli):
    text = json.dumps(good_profile())
    with workdir() as work:
        (work / "job.yaml").write_text(yaml.safe_dump(good_spec()))
        (work / "profile.json").write_text(text[: cut % (len(text) - 1)])
        line = one_line_refusal(
            cli("plan", work / "job.yaml", "--profile", work / "profile.json", "--out", work / "p.json")
        )
        assert "profile" in line and not (work / "p.json").exists()
