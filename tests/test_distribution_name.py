"""Every instruction to install rubberband names our distribution: ``rubberband`` on the public index is an
unrelated audio library, so ``pip install rubberband`` (or ``'rubberband[optuna]'``, ``-U rubberband``) in a message
or a doc would install someone else's code."""

from __future__ import annotations

import re
import tomllib

from conftest import REPO

from rubberband import DIST_NAME, install_hint

#: A ``pip install`` command's arguments: up to the end of the shell command (``&&``, ``;``, ``|``, a closing
#: parenthesis or backquote, the line's end).
PIP = re.compile(r"pip3? install\b([^\n`;|)&]*)")
#: A bare ``rubberband`` requirement, extras or not (the index's ``rubberband`` is not ours).
FOREIGN_WORD = re.compile(r"rubberband(\[[^\]]*\])?")


def foreign_installs(text: str) -> list[str]:
    """The ``pip install`` commands in ``text`` that ask for the requirement ``rubberband``."""
    found = []
    for match in PIP.finditer(text):
        words = [w.strip("'\"") for w in match.group(1).split()]
        if any(FOREIGN_WORD.fullmatch(w) for w in words):
            found.append(match.group(0).strip())
    return found


SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh", ""}


def _texts():
    for path in sorted(REPO.rglob("*")):
        rel = path.relative_to(REPO)
        if not path.is_file() or path.suffix not in SUFFIXES or rel.parts[0] in (".git", "runs", "build"):
            continue
        if any(part.startswith(".") and part not in (".ci",) for part in rel.parts) or "egg-info" in str(rel):
            continue
        if rel == REPO.joinpath(__file__).relative_to(REPO):
            continue  # this test spells the foreign name on purpose
        try:
            yield rel, path.read_text()
        except UnicodeDecodeError:
            continue


def test_no_message_or_doc_tells_a_user_to_install_a_name_that_is_not_ours():
    offenders = [f"{rel}: {command}" for rel, text in _texts() for command in foreign_installs(text)]
    assert offenders == []


def test_the_distribution_is_named_as_the_messages_say():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST_NAME != "rubberband"
    assert install_hint("optuna").startswith(f"pip install '{DIST_NAME}[optuna]'")
    assert foreign_installs("run `pip install 'rubberband[optuna]'`") and foreign_installs("pip install -U rubberband")
    assert foreign_installs("pip install torch==2.13.0 rubberband && rubberband run x.yaml")
    assert not foreign_installs(install_hint("optuna")) and not foreign_installs("pip install -e . && rubberband run")
