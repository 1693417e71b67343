"""Ship this machine's rubberband to a cluster the Ray way: a package in each job's ``runtime_env``.

A cloud node installs only pinned third-party packages at boot (``cloud/bootstrap.py``); rubberband
itself, and the user's training code, reach it with every Ray job the CLI submits:
``runtime_env={"py_modules": [<rubberband package>], "working_dir": <code dir>}``. Ray uploads both
to the head once (content-addressed) and unpacks them on every node where a worker process of the
job starts, putting them first on its import path, so the head's executor and every trial actor
import exactly the rubberband and the training code of the machine that submitted the run — edits
not committed included. No package name is ever resolved on a public index.

:func:`build_package` copies the rubberband that is imported here (an editable checkout, whose
subpackages live in separate top-level folders, or an installed copy: whatever ``import rubberband``
finds) into the importable layout ``<cache>/rubberband-<version>+g<hash>/rubberband/...``:

* sources and data only (``*.py``, the catalogs): no byte code, caches or dot-files, nothing from
  outside the package directories — never a credential;
* no pip on the nodes: Ray unzips a directory module (a wheel would be ``pip install --target``-ed
  on each node for each new job, which also pulls every declared dependency from an index);
* cached by content: unchanged code is copied once per machine and uploaded once per cluster.

:func:`build_wheel` packs the same files as a dependency-free wheel (for a cluster that wants one,
e.g. ``pip install`` on a node by hand); the CLI ships :func:`build_package`.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib
import io
import os
import shutil
import zipfile
from pathlib import Path

#: The importable packages of a rubberband installation (pyproject's ``[tool.setuptools] packages``).
PACKAGES = (
    "rubberband",
    "rubberband.commands",
    "rubberband.report",
    "rubberband.planner",
    "rubberband.profiler",
    "rubberband.cloud",
    "rubberband.executor",
)
#: File names never shipped (byte code, editor and OS leftovers).
_SKIP_SUFFIXES = (".pyc", ".pyo", ".swp", "~")
_SKIP_DIRS = ("__pycache__",)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip timestamps: the same code gives the same bytes


def default_cache_dir() -> Path:
    """Where shipped packages (and wheels) are kept between runs (the user's cache directory)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rubberband" / "shipped"


def package_files() -> list[tuple[str, Path]]:
    """``(name inside the wheel, file on this machine)`` for every shipped file, sorted by name."""
    files: dict[str, Path] = {}
    for name in PACKAGES:
        module = importlib.import_module(name)
        (root,) = list(module.__path__)[:1]
        prefix = name.replace(".", "/")
        for path in sorted(Path(root).rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts):
                continue
            if path.name.endswith(_SKIP_SUFFIXES):
                continue
            # a subdirectory that is one of PACKAGES is shipped under its own name (from its own directory)
            if any(".".join((name, *rel.parts[:i])) in PACKAGES for i in range(1, len(rel.parts))):
                continue
            files[f"{prefix}/{rel.as_posix()}"] = path
    return sorted(files.items())


def content_hash(files: list[tuple[str, Path]]) -> str:
    """A short hash of the shipped files' names and bytes."""
    digest = hashlib.sha256()
    for arcname, path in files:
        digest.update(arcname.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(cache_dir: Path | None = None) -> Path:
    """The wheel of the imported rubberband (built once per content, kept in ``cache_dir``)."""
    from rubberband import DIST_NAME, __version__

    files = package_files()
    version = f"{__version__.split('+')[0]}+g{content_hash(files)}"
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wheel = cache / f"{DIST_NAME.replace('-', '_')}-{version}-py3-none-any.whl"
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    dist_info = f"{DIST_NAME.replace('-', '_')}-{version}.dist-info"
    meta = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {version}\n"
        f"Summary: rubberband as shipped by its CLI to a run's cluster (no dependencies: "
        f"the nodes install them at boot)\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: rubberband.cloud.shipping\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{dist_info}/top_level.txt": "rubberband\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    tmp = wheel.with_name(f".{wheel.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        entries = [(arcname, path.read_bytes()) for arcname, path in files]
        entries += [(arcname, text.encode()) for arcname, text in meta.items()]
        for arcname, data in entries:
            info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            writer.writerow([arcname, _record_hash(data), len(data)])
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=_EPOCH)
        info.external_attr = 0o644 << 16
        zf.writestr(info, record.getvalue())
    tmp.replace(wheel)
    return wheel


def build_package(cache_dir: Path | None = None) -> Path:
    """The imported rubberband as an importable package directory (``.../rubberband``), built once per content."""
    from rubberband import __version__

    files = package_files()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = cache / f"rubberband-{__version__.split('+')[0]}+g{content_hash(files)}"
    if (root / ".complete").is_file():
        return root / "rubberband"
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{root.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for arcname, path in files:
        target = tmp / arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (tmp / ".complete").write_text("")
    try:
        tmp.replace(root)
    except OSError:  # another process built the same content meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return root / "rubberband"


def job_runtime_env(package: Path, working_dir: Path | None = None) -> dict:
    """The ``runtime_env`` of every rubberband job: the shipped rubberband package, the user's code as its
    working directory, and the versions the run's nodes must match (``bootstrap.RUN_VERSIONS_ENV``)."""
    import json

    from rubberband.cloud.bootstrap import RUN_VERSIONS_ENV, passed_versions

    env: dict = {
        "py_modules": [str(package)],
        "env_vars": {RUN_VERSIONS_ENV: json.dumps(passed_versions(), sort_keys=True)},
    }
    if working_dir is not None:
        env["working_dir"] = str(working_dir)
    return env


# -- the training code directory: what is uploaded with every job ------------------------------------

#: Never uploaded, whatever the user's ignore files say: files that commonly hold secrets (the nodes get their
#: cloud access from their own identity; a key or token in the code directory would land on every node and in
#: Ray's package store). gitignore syntax.
SECRET_EXCLUDES = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.asc",
    "*.gpg",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.ppk",
    ".ssh/",
    ".aws/",
    ".gnupg/",
    ".azure/",
    ".config/gcloud/",
    ".kube/",
    "kubeconfig",
    ".docker/config.json",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".vault-token",
    "credentials",
    "credentials.*",
    "credentials-*",
    "*credentials*.json",
    "*service-account*.json",
    "*service_account*.json",
    "application_default_credentials.json",
    "client_secret*.json",
    "secrets.*",
    "*.tfstate",
    "*.tfstate.*",
    "*.tfvars",
    "terraform.tfvars.json",
    ".terraform/",
)
#: Never uploaded either (unless a ``.rubberbandignore`` ``!pattern`` brings one back): version control,
#: environments, caches and run directories.
NOISE_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "env/",
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    "runs/",
    ".DS_Store",
)
#: The user's own excludes, gitignore syntax, at the top of the code directory (``.gitignore`` there counts too).
IGNORE_FILE = ".rubberbandignore"


def _pathspec(lines):
    """A gitignore-style matcher: the ``pathspec`` copy Ray vendors and matches its own ``runtime_env`` excludes with
    (so this filter and Ray's agree), else the ``pathspec`` library."""
    try:
        from ray._private.thirdparty.pathspec import PathSpec
    except ImportError:  # pragma: no cover - a Ray that moved its copy
        from pathspec import PathSpec
    return PathSpec.from_lines("gitwildmatch", list(lines))


class CodeFilter:
    """Which files of a training code directory are uploaded: everything but :data:`SECRET_EXCLUDES` (always),
    :data:`NOISE_EXCLUDES`, and the patterns of the directory's ``.gitignore`` and :data:`IGNORE_FILE`
    (gitignore syntax; a later ``!pattern`` re-includes what an earlier line or the noise list excluded, never a
    secret)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        lines: list[str] = []
        for name in (".gitignore", IGNORE_FILE):
            path = self.root / name
            if path.is_file():
                lines += path.read_text(errors="replace").splitlines()
        self.user_lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
        self._secrets = _pathspec(SECRET_EXCLUDES)
        self._rest = _pathspec([*NOISE_EXCLUDES, *self.user_lines])

    def excluded(self, relative: str, *, is_dir: bool = False) -> bool:
        path = relative + "/" if is_dir and not relative.endswith("/") else relative
        return self._secrets.match_file(path) or self._rest.match_file(path)

    def files(self) -> list[Path]:
        """The files uploaded, relative to the root (excluded directories are not entered; no symlinks)."""
        found: list[Path] = []
        for directory, subdirs, names in os.walk(self.root):
            rel = Path(directory).relative_to(self.root)
            subdirs[:] = sorted(
                d
                for d in subdirs
                if not os.path.islink(os.path.join(directory, d))
                and not self.excluded((rel / d).as_posix(), is_dir=True)
            )
            for name in sorted(names):
                full = Path(directory) / name
                if not full.is_symlink() and full.is_file() and not self.excluded((rel / name).as_posix()):
                    found.append(rel / name)
        return found

    def ray_excludes(self) -> list[str]:
        """The same rules as Ray's ``runtime_env["excludes"]`` (one gitignore spec: the last match decides, so the
        secrets go last and no user line can bring one back)."""
        return [*NOISE_EXCLUDES, *self.user_lines, *SECRET_EXCLUDES]

    def copy_to(self, dest: Path) -> int:
        """Copy the uploaded files into ``dest``; return their total size in bytes."""
        total = 0
        for rel in self.files():
            target = Path(dest) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / rel, target)
            total += target.stat().st_size
        Path(dest).mkdir(parents=True, exist_ok=True)
        return total
