"""`rubberband report` / `write_report`: a self-contained HTML page whose numbers equal the plan's."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from report_helpers import FakeReplanner, make_plan
from rubberband.errors import InputError
from rubberband.plan import write_plan
from rubberband.report import write_report

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


class _Page(HTMLParser):
    """Collects every <img> and every data-field element's raw value."""

    def __init__(self) -> None:
        super().__init__()
        self.imgs: list[dict[str, str]] = []
        self.fields: dict[str, str] = {}
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        if "data-field" in a:
            assert a["data-field"] not in self.fields, f"duplicate data-field {a['data-field']}"
            self.fields[a["data-field"]] = a.get("data-value", "")
        if tag in ("link", "script") or (tag == "img" and not a.get("src", "").startswith("data:")):
            self.external.append(tag)


def _parse(html_path: Path) -> _Page:
    page = _Page()
    page.feed(html_path.read_text(encoding="utf-8"))
    return page


def _check_images(page: _Page, expected: int) -> None:
    assert len(page.imgs) == expected and not page.external
    for img in page.imgs:
        src = img["src"]
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png.startswith(PNG) and len(png) > 5000
        assert img.get("alt")


def _check_numbers(page: _Page, plan: dict) -> None:
    """The figures in the page are the plan JSON's, exactly."""
    f = page.fields
    p = plan["predicted"]
    assert float(f["jct_p50_s"]) == p["jct_s"]["p50"]
    assert float(f["jct_p95_s"]) == p["jct_s"]["p95"]
    assert float(f["cost_mean_usd"]) == p["cost_usd"]["mean"]
    assert float(f["cost_p95_usd"]) == p["cost_usd"]["p95"]
    assert float(f["p_meet_deadline"]) == p["p_meet_deadline"]
    assert float(f["deadline_s"]) == plan["deadline_s"]
    assert float(f["confidence"]) == plan["confidence"]
    static = plan["baselines"]["static"]["predicted"]["cost_usd"]["mean"]
    assert float(f["static_cost_mean_usd"]) == static
    assert float(f["savings_usd"]) == pytest.approx(static - p["cost_usd"]["mean"], rel=1e-12)
    assert float(f["savings_ratio"]) == pytest.approx(static / p["cost_usd"]["mean"], rel=1e-12)
    assert plan["stages"], "a plan has stages"
    for i, st in enumerate(plan["stages"]):
        assert int(f[f"stage.{i}.instances"]) == st["instances"]
        assert int(f[f"stage.{i}.workers_per_trial"]) == st["workers_per_trial"]
        assert int(f[f"stage.{i}.trials"]) == st["trials"]
        assert int(f[f"stage.{i}.epochs"]) == st["epochs"]
        assert f[f"stage.{i}.instance_type"] == st["instance_type"]
        assert float(f[f"stage.{i}.cost_usd"]) == st["predicted_cost_usd"]
    assert f"stage.{len(plan['stages'])}.instances" not in f


def _check_markdown(out: Path, expected_images: int) -> str:
    md = (out / "report.md").read_text(encoding="utf-8")
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(refs) == expected_images
    for ref in refs:
        path = out / ref
        assert path.parent == out and path.read_bytes().startswith(PNG) and path.stat().st_size > 5000
    for heading in (
        "## Summary",
        "## Plan by stage",
        "## Cost breakdown",
        "## Allocation over time",
        "## Predicted distributions",
        "## Cost versus deadline",
        "## Cloud comparison",
    ):
        assert heading in md
    return md


def _plan_file(tmp_path: Path, **kw) -> tuple[Path, dict]:
    path = tmp_path / "plan.json"
    write_plan(make_plan(deadline_s=900, level=2, **kw), path)
    return path, json.loads(path.read_text())


def test_report_numbers_images_and_markdown(tmp_path):
    plan_path, plan = _plan_file(tmp_path)
    out = tmp_path / "rep"
    html = write_report(plan_path, out, replan=FakeReplanner())
    assert html == out / "report.html"
    page = _parse(html)
    _check_images(page, 5)  # plan Gantt, static Gantt, distributions, costs, Pareto
    _check_numbers(page, plan)
    md = _check_markdown(out, 5)
    assert "Note:" not in md  # every section is present
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "report.html",
            "report.md",
            "costs.png",
            "distributions.png",
            "gantt_plan.png",
            "gantt_static.png",
            "pareto.png",
        ]
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rep")]  # no temp folder left
    text = html.read_text()
    assert "GCP, on-demand" in text and "AWS, spot allowed" in text


def test_omitted_sections_carry_notes(tmp_path):
    plan_path, plan = _plan_file(tmp_path, samples=0, with_static=False)
    out = tmp_path / "rep"
    page = _parse(write_report(plan_path, out, replan=False))
    _check_images(page, 2)  # plan Gantt and costs only
    text = (out / "report.html").read_text()
    for key in ("summary", "gantt_static", "distributions", "pareto", "clouds"):
        assert f'data-note="{key}"' in text
    assert "--no-replan" in text
    assert float(page.fields["jct_p95_s"]) == plan["predicted"]["jct_s"]["p95"]
    md = _check_markdown(out, 2)
    assert md.count("**Note:**") == 5


def test_existing_out_dir_needs_force(tmp_path):
    plan_path, _ = _plan_file(tmp_path)
    out = tmp_path / "rep"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="--force"):
        write_report(plan_path, out, replan=False)
    assert (out / "keep.txt").read_text() == "mine"
    write_report(plan_path, out, force=True, replan=False)
    assert not (out / "keep.txt").exists() and (out / "report.html").stat().st_size > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "rep"]


def test_failure_leaves_nothing_behind(tmp_path):
    plan_path, _ = _plan_file(tmp_path)

    def broken(_request):
        raise KeyboardInterrupt  # not a RubberbandError: escapes build_report_data

    with pytest.raises(KeyboardInterrupt):
        write_report(plan_path, tmp_path / "rep", replan=broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_cli_report_force_and_bad_plans(tmp_path, cli_here):
    plan_path, plan = _plan_file(tmp_path, with_spec=False)  # no spec: the report notes it cannot re-plan
    out = tmp_path / "rep"
    r = cli_here("report", plan_path, "--out", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out / "report.html")
    _check_numbers(_parse(out / "report.html"), plan)
    assert "no job spec" in (out / "report.html").read_text()
    r = cli_here("report", plan_path, "--out", out)
    assert r.returncode == 2 and "--force" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli_here("report", plan_path, "--out", out, "--force", "--no-replan")
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        target = tmp_path / "never"
        r = cli_here("report", path, "--out", target)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
        assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "plan.json", "rep"]


def test_plan_report_end_to_end(tmp_path, cli_here):
    """The real planner on the quickstart, re-planned for the sweep and the cloud comparison."""
    out = tmp_path / "rep"
    plan_path = tmp_path / "p.json"
    r = cli_here(
        "plan", ROOT / "examples" / "quickstart.yaml", "--samples", "200", "--out", plan_path, "--report", out, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert f"Report written to {out / 'report.html'}" in r.stdout.replace("\n", "")
    plan = json.loads(plan_path.read_text())
    page = _parse(out / "report.html")
    _check_images(page, 5)
    _check_numbers(page, plan)
    _check_markdown(out, 5)
    r = cli_here("plan", ROOT / "examples" / "quickstart.yaml", "--samples", "200", "--report", out, cwd=ROOT)
    assert r.returncode == 2 and "already exists" in r.stderr


@pytest.mark.e2e  # starts headless Chromium
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed, so the page cannot be rendered")
def test_report_renders_in_headless_chromium(tmp_path):
    plan_path, _ = _plan_file(tmp_path)
    html = write_report(plan_path, tmp_path / "rep", replan=FakeReplanner())
    probe = """<script>
      window.addEventListener('load', () => {
        const imgs = Array.from(document.images);
        const ok = imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0);
        const out = document.createElement('div');
        out.id = 'rb-probe';
        out.textContent = 'IMAGES ' + imgs.length + ' ' + (ok ? 'ALL-DECODED' : 'BROKEN') +
          ' WIDTH ' + document.querySelector('main').getBoundingClientRect().width;
        document.body.appendChild(out);
      });
    </script>"""
    copy = tmp_path / "probe.html"
    copy.write_text(html.read_text().replace("</body>", probe + "</body>"))
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        copy.as_uri(),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<div id="rb-probe">IMAGES (\d+) (\S+) WIDTH ([\d.]+)</div>', r.stdout)
    assert found, r.stderr[-2000:]
    assert (found[1], found[2]) == ("5", "ALL-DECODED")
    width = float(found[3])
    assert width > 300  # the layout rendered (not collapsed to nothing)
