"""A spec's requirements reach a node's root shell at boot: they are quoted as words and never run.

The rendered worker script's ``say 'installing …'`` and ``pip install …`` lines are executed by a real bash
(with an empty PATH and a stub interpreter, so nothing but bash's builtins could run if quoting failed) for
every PEP 508 shape hypothesis draws, shell metacharacters in versions, URLs and marker strings included:
bash must print exactly the requirements and leave no file behind. Logins in requirement URLs are refused
before anything is rendered (they would land in user-data and on the serial console).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from packaging.requirements import InvalidRequirement, Requirement

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.bootstrap import BootstrapConfig, render_startup_script
from rubberband.cloud.shell import say_line, shell_word
from rubberband.errors import InputError, SpecError
from rubberband.spec import load_spec

VERSIONS = dict(ray_version="2.60.0", python_version="3.11", torch_version="2.13.0")
PIP = "-m pip install --quiet --disable-pip-version-check"
#: Shell metacharacters, quotes and expansions, plus a little plain text.
SHELL_TEXT = st.text(alphabet=list("$`'\"\\;|&<>(){}[]*?!#~%^=+,.:/-_ \tabcXYZ019"), max_size=24)
VERSION = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,2}(\.\*)?", fullmatch=True)
NAME = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?", fullmatch=True)


@st.composite
def requirements(draw) -> str:
    """Requirement strings of every PEP 508 shape, with shell text wherever the grammar lets text in."""
    name = draw(NAME)
    extras = draw(st.lists(NAME, max_size=2))
    head = name + (f"[{','.join(extras)}]" if extras else "")
    shape = draw(st.sampled_from(["bare", "version", "arbitrary", "url"]))
    if shape == "version":
        op = draw(st.sampled_from(["==", ">=", "<=", "~=", "!=", "<", ">"]))
        head += op + draw(VERSION)
    elif shape == "arbitrary":
        head += "===" + draw(SHELL_TEXT.filter(lambda s: s and not any(c.isspace() for c in s)))
    elif shape == "url":
        path = draw(SHELL_TEXT.filter(lambda s: not any(c.isspace() or c in "@'\"" for c in s)))
        head += f" @ https://example.org/{path}"
    if draw(st.booleans()):
        quote = draw(st.sampled_from(["'", '"']))
        text = draw(SHELL_TEXT.filter(lambda s, q=quote: q not in s))
        marker = draw(st.sampled_from(["python_version >=", "platform_machine ==", "extra ==", "sys_platform !="]))
        head += f"{' ' if shape == 'url' else ''}; {marker} {quote}{text}{quote}"
    try:
        Requirement(head)
    except InvalidRequirement:
        assume(False)
    return head


def _install_lines(script: str) -> str:
    """The rendered script's announcement and installation of the packages: the lines the spec's text reaches."""
    lines = [line for line in script.splitlines() if line.startswith("say 'installing") or PIP in line]
    assert len(lines) == 2, lines
    return "\n".join(lines)


def _run_install(tmp_path: Path, requirement: str) -> tuple[list[str], list[str]]:
    """Render a worker script with ``requirement``; run its install lines in bash; what ``say`` and pip were given."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    stub = venv / "bin" / "python"
    stub.write_text("#!/bin/bash\nprintf 'ARG:%s\\n' \"$@\"\n")
    stub.chmod(0o755)
    script = render_startup_script(
        BootstrapConfig(
            run_id="run-q",
            dialect=AWS_BOOT,
            role="worker",
            head_address="10.0.0.2",
            ray_auth="disabled",
            requirements=(requirement,),
            venv=str(venv),
            **VERSIONS,
        )
    )
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    harness = "say() { printf 'SAY:%s\\n' \"$*\"; }\n" + _install_lines(script) + "\n"
    done = subprocess.run(
        ["/bin/bash", "-c", harness], cwd=work, env={"PATH": str(tmp_path / "empty")}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert os.listdir(work) == [], f"the install lines wrote {os.listdir(work)}"
    out = done.stdout.splitlines()
    said = [line[4:] for line in out if line.startswith("SAY:")]
    args = [line[4:] for line in out if line.startswith("ARG:")]
    return said, args


def _expected_args(requirement: str) -> list[str]:
    return [*PIP.split(), "ray[default]==2.60.0", requirement]


@pytest.mark.e2e  # runs bash
@pytest.mark.parametrize(
    "requirement",
    [
        "numpy; python_version >= '$(echo pwned > PWNED)'",  # the example, with a builtin that writes
        'numpy; python_version >= "`echo pwned > PWNED`"',
        "numpy; python_version >= \"x'; echo pwned > PWNED; '\"",
        "pkg===a`echo>PWNED`",
        "pkg @ https://example.org/a$(echo>PWNED).whl",
    ],
)
def test_a_requirement_that_holds_a_command_is_installed_as_text(tmp_path, requirement):
    Requirement(requirement)  # each is a valid PEP 508 requirement the spec accepts
    said, args = _run_install(tmp_path, requirement)
    assert said == [f"installing ray[default]==2.60.0 {requirement}"]
    assert args == _expected_args(requirement)


@pytest.mark.e2e  # runs bash
# packaging reads a marker value holding a backslash with ast.literal_eval, which warns of the escape it is
# meant to keep (packaging/_parser.py, process_python_str): the drawn text is the point, the warning is not ours
@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requirement=requirements())
def test_every_requirement_shape_reaches_pip_as_one_word(tmp_path_factory, requirement):
    said, args = _run_install(tmp_path_factory.mktemp("req"), requirement)
    assert said == [f"installing ray[default]==2.60.0 {requirement}"]
    assert args == _expected_args(requirement)


@given(text=SHELL_TEXT)
def test_say_line_quotes_to_one_word(text):
    import shlex

    assert shlex.split(shell_word(text)) == [text]
    assert shlex.split(say_line(text)) == ["say", text]


@pytest.mark.parametrize(
    "requirement",
    [
        "pkg @ git+https://user:token@git.example.com/org/pkg.git",
        "pkg @ https://ghp_abcdefghijklmnop@github.com/org/pkg/archive/main.zip",
    ],
)
def test_a_login_in_a_requirement_url_is_refused_before_anything_is_rendered(tmp_path, requirement):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
            name: creds
            train: train:train
            metric: {{name: acc, mode: max}}
            scheduler: {{kind: sha, eta: 3, min_epochs: 1, max_epochs: 9, trials: 9}}
            search_space: {{lr: {{type: loguniform, low: 0.001, high: 0.1}}}}
            deadline: 1h
            requirements: ["{requirement}"]
            """)
    )
    with pytest.raises(SpecError, match=r"'requirements'.*pip config") as info:
        load_spec(spec)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="login in its URL"):
        BootstrapConfig(run_id="run-q", dialect=AWS_BOOT, role="head", requirements=(requirement,), **VERSIONS)


def test_an_ssh_git_user_is_no_login():
    config = BootstrapConfig(
        run_id="run-q",
        dialect=AWS_BOOT,
        role="head",
        requirements=("pkg @ git+ssh://git@github.com/o/p.git",),
        **VERSIONS,
    )
    assert "git+ssh://git@github.com/o/p.git" in render_startup_script(config)


@pytest.mark.parametrize("field", ["ray_version", "torch_version", "rubberband_version"])
def test_a_version_that_is_not_one_is_refused(field):
    with pytest.raises(InputError, match=field):
        BootstrapConfig(run_id="run-q", dialect=AWS_BOOT, role="head", **{**VERSIONS, field: "2.0\n$(reboot)"})
