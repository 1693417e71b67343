"""Shipping this machine's rubberband with each Ray job: what the package holds, its caching, and that a Python
without rubberband imports and uses it. (tests/test_cloud_boot.py ships it to a real booted cluster.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from rubberband.cloud.bootstrap import RUN_VERSIONS_ENV, passed_versions
from rubberband.cloud.shipping import PACKAGES, build_package, build_wheel, content_hash, job_runtime_env, package_files

from conftest import REPO


def test_the_package_holds_sources_and_catalogs_only():
    names = [name for name, _ in package_files()]
    assert "rubberband/planner/__init__.py" in names and "rubberband/cloud/shipping.py" in names
    assert "rubberband/catalogs/aws.csv" in names  # package data travels too
    assert "rubberband/catalogs/spot_model.json" in names  # the shipped spot model, for re-plans on the head
    kinds = (".py", ".csv", "catalogs/spot_model.json", "catalogs/clouds.yaml")
    assert all(name.endswith(kinds) for name in names), [n for n in names if not n.endswith(kinds)]
    assert not any("__pycache__" in name or "egg-info" in name or "/." in name for name in names)
    assert len(names) == len(set(names)) and all(name.split("/")[0] == "rubberband" for name in names)
    assert {".".join(n.split("/")[:-1]) for n in names if n.endswith("/__init__.py")} >= set(PACKAGES)


@pytest.mark.e2e  # runs Python and pip in subprocesses
def test_package_is_cached_by_content_and_imports_without_rubberband_installed(tmp_path):
    package = build_package(tmp_path / "cache")
    assert package.name == "rubberband" and package.parent.name == f"rubberband-0.1.0+g{content_hash(package_files())}"
    assert build_package(tmp_path / "cache") == package  # built once
    env = job_runtime_env(package, tmp_path)
    assert env["py_modules"] == [str(package)] and env["working_dir"] == str(tmp_path)
    passed = json.loads(env["env_vars"][RUN_VERSIONS_ENV])  # what the head's nodes must match
    assert passed == passed_versions() and "python_version" not in passed  # each machine's own minor
    assert any(r.startswith("numpy==") for r in passed["requirements"])
    assert not any(r.split("==")[0] in ("torch", "ray", "matplotlib") for r in passed["requirements"])
    # another interpreter with the package first on its path (as Ray puts py_modules) imports and uses it
    probe = (
        "import rubberband, rubberband.planner, rubberband.head_job; "
        "from rubberband.catalog import load_catalog; "
        "print(rubberband.__file__); print(len(load_catalog(['aws']).types) > 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(package.parent)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    where, catalog = done.stdout.split()
    assert where.startswith(str(package)) and not where.startswith(str(REPO)) and catalog == "True"


@pytest.mark.e2e  # runs Python and pip in subprocesses
def test_the_wheel_has_no_dependencies_and_installs_offline(tmp_path):
    wheel = build_wheel(tmp_path / "wheels")
    assert wheel.name.startswith("rubberband_hpo-0.1.0+g") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist" not in meta  # pip --target on a node must not pull numpy, torch, ... from an index
    target = tmp_path / "target"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--quiet", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (target / "rubberband" / "catalogs" / "gcp.csv").is_file()
    assert (target / "rubberband" / "executor" / "trials.py").read_bytes() == (
        REPO / "executor" / "trials.py"
    ).read_bytes()


def test_the_code_directory_never_ships_secrets(tmp_path):
    """The training code directory goes with every job: files that commonly hold secrets stay behind."""
    from rubberband.cloud.head_session import stage_code
    from rubberband.spec import load_spec

    code = tmp_path / "code"
    shutil.copytree(REPO / "examples", code)
    for name in (".env", "prod.pem", "id_rsa", "credentials.json", "my-service-account-key.json"):
        (code / name).write_text("secret\n")
    (code / ".aws").mkdir()
    (code / ".aws" / "credentials").write_text("[default]\n")
    spec = load_spec(code / "digits.yaml")
    from test_cloud_headmode import _digits_plan

    work = stage_code(spec, _digits_plan(spec), tmp_path / "stage")
    shipped = {p.relative_to(work).as_posix() for p in work.rglob("*")}
    assert "digits.py" in shipped and "_rubberband/spec.json" in shipped
    assert not shipped & {".env", "prod.pem", "id_rsa", "credentials.json", "my-service-account-key.json", ".aws"}


def test_code_filter_keeps_secrets_out_and_honours_the_users_ignore_files(tmp_path):
    """Secrets stay behind whatever the ignore files say; .gitignore and .rubberbandignore (gitignore syntax,
    ``!`` re-includes) exclude more; Ray's excludes for --head local say the same."""
    from rubberband.cloud.shipping import SECRET_EXCLUDES, CodeFilter

    code = tmp_path / "code"
    for rel in (
        "train.py",
        "pkg/model.py",
        "data/big.bin",
        "data/keep.txt",
        "notes.log",
        "config/.env.prod",
        "deploy/server.pem",
        "keys/id_ed25519.pub",
        ".aws/credentials",
        "gcp/application_default_credentials.json",
        "infra/terraform.tfstate",
        ".git/config",
        "pkg/__pycache__/m.pyc",
        "runs/r1/journal.jsonl",
        "venv/bin/python",
        ".config/gcloud/credentials.db",
        "credentials",
    ):
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text("x\n")
    (code / ".gitignore").write_text("*.log\n")
    (code / ".rubberbandignore").write_text(
        "# data sets are downloaded in train\ndata/\n!data/keep.txt\n!deploy/server.pem\n!venv/\n"
    )
    code_filter = CodeFilter(code)
    shipped = {p.as_posix() for p in code_filter.files()}
    assert shipped == {"train.py", "pkg/model.py", ".gitignore", ".rubberbandignore", "venv/bin/python"}
    # a directory excluded as a whole is not entered: `!data/keep.txt` cannot re-include inside it (as in git)
    assert code_filter.excluded("deploy/server.pem") and code_filter.excluded("data/big.bin")
    assert code_filter.ray_excludes()[-len(SECRET_EXCLUDES) :] == list(SECRET_EXCLUDES)  # last: they win in Ray's spec
    from ray._private.thirdparty.pathspec import PathSpec

    ray_spec = PathSpec.from_lines("gitwildmatch", code_filter.ray_excludes())
    assert (
        ray_spec.match_file("deploy/server.pem") and ray_spec.match_file(".env") and not ray_spec.match_file("train.py")
    )


def test_a_job_is_submitted_once_the_heads_job_agent_answers(monkeypatch):
    """A head whose Ray is up can answer 500 "No available agent to submit job, please try again later" while its
    job agent starts (it failed a boot test in CI): the submission is retried each second, within its time; any
    other refusal, or one that outlasts the time, is a CloudError naming the head. The real agent:
    tests/test_cloud_boot.py and tests/test_boot_os.py submit through this."""
    from rubberband.cloud import head_session
    from rubberband.cloud.head_session import submit_when_ready
    from rubberband.errors import CloudError

    busy = RuntimeError(
        "Request failed with status code 500: No available agent to submit job, please try again later.."
    )

    class Jobs:
        def __init__(self, *answers):
            self.answers, self.asked = list(answers), []

        def submit_job(self, **job):
            self.asked.append(job)
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    slept: list[float] = []
    monkeypatch.setattr(head_session.time, "sleep", slept.append)
    jobs = Jobs(busy, busy, "raysubmit_1")
    assert submit_when_ready(jobs, 60.0, "head i-1", entrypoint="python run.py") == "raysubmit_1"
    assert slept == [1.0, 1.0] and jobs.asked == [{"entrypoint": "python run.py"}] * 3
    with pytest.raises(CloudError, match=r"^head i-1 refused the job: .*status code 400"):
        submit_when_ready(Jobs(RuntimeError("Request failed with status code 400: bad runtime_env")), 60.0, "head i-1")
    with pytest.raises(CloudError, match=r"^head i-1 refused the job: .*No available agent"):
        submit_when_ready(Jobs(busy), 0.0, "head i-1")
