"""``rubberband report``: a self-contained HTML (and Markdown) report of a plan, or of a run (predicted vs actual)."""

from __future__ import annotations

import typer

ORDER = 25


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        plan: str = typer.Argument(
            ...,
            metavar="PLAN_OR_RUN_DIR",
            help="Plan JSON (from `rubberband plan --out`) or a run directory "
            "(from `rubberband run`: adds predicted vs actual).",
        ),
        out: str = typer.Option(..., "--out", help="Folder to write report.html, report.md and charts into."),
        force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
        no_replan: bool = typer.Option(
            False, "--no-replan", help="Skip the cost-vs-deadline sweep and cloud comparison (faster)."
        ),
    ) -> None:
        """Write report.html (one file, charts inline) and report.md for a plan or a run; print its path."""
        from rubberband.report import write_report  # matplotlib: imported only by the commands that draw

        path = write_report(plan, out, force=force, replan=False if no_replan else None)
        typer.echo(str(path))
