import json

import pytest
from hypothesis import given, strategies as st

from rubberband.planner.schedule import (
    asha_stages,
    hyperband_brackets,
    rungs,
    sha_default_trials,
    sha_stages,
    stages_for,
)

# Li et al., Hyperband, Table 1 (R=81, η=3): (n_i, r_i) per bracket s = 4..0
PAPER_TABLE = [
    [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    [(34, 3), (11, 9), (3, 27), (1, 81)],
    [(15, 9), (5, 27), (1, 81)],
    [(8, 27), (2, 81)],
    [(5, 81)],
]


def test_hyperband_matches_paper_table():
    brackets = hyperband_brackets(eta=3, min_epochs=1, max_epochs=81)
    assert [[(s.trials, s.epochs) for s in b] for b in brackets] == PAPER_TABLE


def test_sha_stages_and_increments():
    stages = sha_stages(81, 3, 1, 27)
    assert [(s.trials, s.epochs, s.epochs_this_stage) for s in stages] == [
        (81, 1, 1),
        (27, 3, 2),
        (9, 9, 6),
        (3, 27, 18),
    ]


def test_sha_stops_when_one_trial_left():
    assert [(s.trials, s.epochs) for s in sha_stages(9, 3, 1, 81)] == [(9, 1), (3, 3), (1, 9)]


@given(n=st.integers(1, 500), eta=st.integers(2, 5), r=st.integers(1, 5), extra=st.integers(0, 200))
def test_sha_invariants(n, eta, r, extra):
    R = r + extra
    stages = sha_stages(n, eta, r, R)
    assert stages[0].trials == n and stages[0].epochs == r
    for a, b in zip(stages, stages[1:]):
        assert b.trials == a.trials // eta and b.trials >= 1
        assert b.epochs > a.epochs
    assert all(s.epochs <= R for s in stages)
    assert sum(s.epochs_this_stage for s in stages) == stages[-1].epochs


def test_stages_for_hyperband_runs_brackets_in_order():
    stages = stages_for("hyperband", trials=None, eta=3, min_epochs=1, max_epochs=81)
    assert [s.bracket for s in stages] == sorted(s.bracket for s in stages)
    assert len(stages) == 15


def test_schedule_cli_json(cli):  # through the real entry point, in a subprocess (the others run in this process)
    result = cli("schedule", "--min-epochs", "1", "--max-epochs", "81", "--eta", "3", "--hyperband", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [[(s["trials"], s["epochs"]) for s in b["stages"]] for b in data["brackets"]] == PAPER_TABLE


@pytest.mark.parametrize(
    "eta, r, R, n", [(3, 1, 81, 81), (3, 1, 27, 27), (3, 1, 10, 9), (2, 1, 8, 8), (4, 2, 32, 16), (3, 5, 5, 1)]
)
def test_sha_default_trials_leaves_one_survivor(eta, r, R, n):
    assert sha_default_trials(eta, r, R) == n
    assert sha_stages(n, eta, r, R)[-1].trials == 1
    # Hyperband's most exploratory bracket starts with the same number of trials
    assert hyperband_brackets(eta, r, R)[0][0].trials == n


@pytest.mark.e2e
def test_schedule_cli_derives_sha_trials(cli_here):
    result = cli_here("schedule", "--min-epochs", "1", "--max-epochs", "81", "--eta", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["trials"] == 81
    assert [(s["trials"], s["epochs"]) for s in data["brackets"][0]["stages"]] == PAPER_TABLE[0]
    table = cli_here("schedule", "--min-epochs", "1", "--max-epochs", "27")
    assert table.returncode == 0 and "n=27 (η^3, derived from R and η)" in table.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--min-epochs", "1", "--max-epochs", "9", "--eta", "1", "--trials", "9"], "--eta"),
        (["--min-epochs", "5", "--max-epochs", "2", "--trials", "9"], "--min-epochs"),
        (["--min-epochs", "1", "--max-epochs", "9", "--trials", "0"], "--trials"),
        (["--min-epochs", "x", "--max-epochs", "9"], "--min-epochs"),
        (["--bogus"], "--bogus"),
    ],
)
def test_schedule_cli_bad_flags(cli_here, args, fragment):
    result = cli_here("schedule", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr


def test_asha_stages_are_the_rungs_with_shas_survivors_for_scale():
    stages = asha_stages(81, 3, 1, 27)
    assert [(s.bracket, s.index, s.trials, s.epochs, s.epochs_this_stage) for s in stages] == [
        (0, 0, 81, 1, 1),
        (0, 1, 27, 3, 2),
        (0, 2, 9, 9, 6),
        (0, 3, 3, 27, 18),
    ]
    # unlike SHA, the rungs go on to max_epochs (at least one trial each), and end there
    assert [(s.trials, s.epochs) for s in asha_stages(9, 3, 1, 81)] == [(9, 1), (3, 3), (1, 9), (1, 27), (1, 81)]
    assert [s.epochs for s in asha_stages(5, 4, 1, 100)] == rungs(4, 1, 100) == [1, 4, 16, 64, 100]
    assert stages_for("asha", trials=81, eta=3, min_epochs=1, max_epochs=27) == stages
    with pytest.raises(ValueError, match="ASHA needs a number of trials"):
        stages_for("asha", trials=None, eta=3, min_epochs=1, max_epochs=27)
    with pytest.raises(ValueError, match="unknown scheduler kind"):
        stages_for("bohb", trials=9, eta=3, min_epochs=1, max_epochs=27)
    with pytest.raises(ValueError):
        asha_stages(0, 3, 1, 27)


def test_asha_reexports_the_rungs_of_the_schedule():
    from rubberband.planner import asha

    assert asha.rungs is rungs
