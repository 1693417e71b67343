"""``rubberband report``: a self-contained HTML (and Markdown) report of a plan."""

from __future__ import annotations

import typer

from rubberband.report import write_report

ORDER = 25


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        plan: str = typer.Argument(..., help="Plan JSON (from `rubberband plan --out`)."),
        out: str = typer.Option(..., "--out", help="Folder to write report.html, report.md and charts into."),
        force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
        no_replan: bool = typer.Option(False, "--no-replan",
                                       help="Skip the cost-vs-deadline sweep and cloud comparison (faster)."),
    ) -> None:
        """Write report.html (one file, charts inline) and report.md for a plan; print report.html's path."""
        path = write_report(plan, out, force=force, replan=False if no_replan else None)
        typer.echo(str(path))
