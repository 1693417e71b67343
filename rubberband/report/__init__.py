"""``rubberband report``: an HTML and a Markdown report of a plan, written atomically into one folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rubberband.errors import InputError, RubberbandError

if TYPE_CHECKING:  # the package is imported for its light modules too (model, replan, fmt): no matplotlib then
    from rubberband.plan import Plan
    from rubberband.report.replan import Replanner
    from rubberband.report.source import ReportSource

__all__ = ["write_report"]

_NO_REPLAN = "re-planning was turned off (--no-replan)"


def write_report(
    plan_or_path: "ReportSource | Plan | str | Path",
    out_dir: str | Path,
    *,
    force: bool = False,
    replan: Replanner | None | bool = None,
) -> Path:
    """Write report.html, report.md and the chart PNGs into ``out_dir``; return report.html's path.

    ``replan``: a Replanner to use, ``None`` to build the default one from the plan's embedded
    spec, or ``False`` to skip the what-if sections. Everything is built in a temp folder next to
    ``out_dir`` and renamed into place at the end, so a failure leaves nothing half-written.
    """
    from rubberband.report.charts import draw_all  # matplotlib: only where a report is drawn
    from rubberband.report.html import render_html
    from rubberband.report.markdown import render_markdown
    from rubberband.report.model import build_report_data
    from rubberband.report.replan import default_replanner
    from rubberband.report.source import as_source

    out = Path(out_dir)
    if out.exists() and not force:
        raise InputError(f"{out} already exists; pass --force to replace it or choose another --out")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a folder; choose another --out")
    source = as_source(plan_or_path)
    if replan is False:
        replanner, why = None, _NO_REPLAN
    elif replan is None or replan is True:
        try:
            replanner, why = default_replanner(source.plan)
        except RubberbandError as exc:  # e.g. the profile the plan names is gone
            replanner, why = None, f"cannot re-plan: {exc.message}"
    else:
        replanner, why = replan, ""
    data = build_report_data(source, replan=replanner, replan_missing=why or "no planner was given")
    charts = draw_all(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the report folder is an ordinary one
        for chart in charts.all():
            (tmp / chart.filename).write_bytes(chart.png)
        (tmp / "report.md").write_text(render_markdown(data, charts), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(data, charts), encoding="utf-8")
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            if old.exists():
                shutil.rmtree(old)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "report.html"
