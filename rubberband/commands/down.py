"""``rubberband down``: stop whatever a run left behind (local Ray nodes and head; clouds extend it)."""

from __future__ import annotations

import typer

from rubberband.console import stdout

ORDER = 60


def register(app: typer.Typer) -> None:
    @app.command("down")
    def down(run: str = typer.Argument(..., metavar="RUN_ID_OR_DIR", help="Run directory or run id.")) -> None:
        """Terminate every instance a run left running and say what was terminated."""
        from rubberband.cloud.local import LocalProvider
        from rubberband.commands.run import resolve_run_dir
        from rubberband.executor import journal as J

        directory = resolve_run_dir(run)
        provider = LocalProvider(directory)
        records = {r.id: r for r in provider.records()}
        if not records and not (directory / J.JOURNAL_NAME).exists():
            from rubberband.errors import RunDirError

            raise RunDirError(f"{directory} is not a run directory (no journal, no instances/); "
                              f"pass the directory `rubberband run` created")
        journal = J.Journal(directory) if (directory / J.JOURNAL_NAME).exists() else None
        out = stdout()
        stopped = 0
        for instance in provider.list():
            record = records[instance.id]
            provider.terminate([instance.id])
            stopped += 1
            if journal is not None:
                journal.record(J.INSTANCE_TERMINATED, id=instance.id, reason="down")
            out.print(f"terminated {instance.id} ({instance.instance_type}, run {instance.run_id}, "
                      f"pid {record.pid})", markup=False, highlight=False)
        head = provider.head()
        if head is not None and provider.stop_head():
            stopped += 1
            out.print(f"terminated the Ray head of run {head.run_id} (pid {head.pid})", markup=False,
                      highlight=False)
        if journal is not None and stopped:
            journal.record(J.DECISION, kind="down", terminated=stopped)
        if not stopped:
            out.print(f"nothing left running for {directory}", markup=False, highlight=False)
