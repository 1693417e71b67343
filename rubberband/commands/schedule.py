"""``rubberband schedule``: print the SHA stages, every Hyperband bracket, or ASHA's rungs."""

from __future__ import annotations

import json
import math

import typer
from rich.table import Table

from rubberband.console import stdout
from rubberband.errors import InputError
from rubberband.planner.schedule import asha_stages, hyperband_brackets, sha_default_trials, sha_stages

ORDER = 40


def register(app: typer.Typer) -> None:
    @app.command("schedule")
    def schedule(
        min_epochs: int = typer.Option(..., "--min-epochs", "-r", help="Minimum epochs per trial (r)."),
        max_epochs: int = typer.Option(..., "--max-epochs", "-R", help="Maximum epochs per trial (R)."),
        eta: int = typer.Option(3, "--eta", help="Reduction factor η (≥ 2)."),
        trials: int = typer.Option(
            None, "--trials", "-n", help="Trials for SHA (default η^s_max, s_max = floor(log_η(R/r)): one survivor)."
        ),
        hyperband: bool = typer.Option(False, "--hyperband", help="Print every Hyperband bracket."),
        asha: bool = typer.Option(
            False, "--asha", help="Print ASHA's rungs (trials: SHA's survivors at each, for scale; ASHA's vary)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout and nothing else."),
    ) -> None:
        """Print the (n_i, r_i) stages of successive halving, of every Hyperband bracket, or ASHA's rungs."""
        if hyperband and asha:
            raise InputError("--hyperband and --asha: choose one schedule")
        if eta < 2:
            raise InputError(f"--eta must be at least 2 (got {eta})")
        if min_epochs < 1 or max_epochs < min_epochs:
            raise InputError(f"need 1 ≤ --min-epochs ≤ --max-epochs (got {min_epochs} and {max_epochs})")
        derived = ""
        if hyperband:
            brackets = hyperband_brackets(eta, min_epochs, max_epochs)
        else:
            if trials is None:
                trials = sha_default_trials(eta, min_epochs, max_epochs)
                derived = f" (η^{round(math.log(trials, eta))}, derived from R and η)"
            elif trials < 1:
                raise InputError(
                    f"--trials must be a positive number for SHA (got {trials}); leave it out to derive it from R and η"
                )
            brackets = [(asha_stages if asha else sha_stages)(trials, eta, min_epochs, max_epochs)]
        if as_json:
            payload = [
                {
                    "bracket": b,
                    "s": len(stages) - 1,
                    "stages": [{"trials": s.trials, "epochs": s.epochs} for s in stages],
                }
                for b, stages in enumerate(brackets)
            ]
            typer.echo(
                json.dumps(
                    {
                        "kind": "hyperband" if hyperband else "asha" if asha else "sha",
                        "eta": eta,
                        "trials": trials,
                        "min_epochs": min_epochs,
                        "max_epochs": max_epochs,
                        "brackets": payload,
                    }
                )
            )
            return
        console = stdout()
        for b, stages in enumerate(brackets):
            name = "ASHA rungs" if asha else "Successive halving"
            title = (
                f"Hyperband bracket s={len(stages) - 1}"
                if hyperband
                else f"{name}: n={trials}{derived}, η={eta}, r={min_epochs}, R={max_epochs}"
            )
            table = Table(title=title, title_justify="left")
            table.add_column("stage i", justify="right")
            table.add_column("trials n_i", justify="right")
            table.add_column("epochs r_i", justify="right")
            table.add_column("trial-epochs this stage", justify="right")
            for s in stages:
                table.add_row(str(s.index), str(s.trials), str(s.epochs), str(s.trials * s.epochs_this_stage))
            console.print(table)
