"""The one way a value reaches a shell: as a single quoted word.

Everything rubberband renders for a shell (a node's startup script, its watchdog, a command run over SSH)
takes values from outside the code — a spec's requirements, a run id, paths, versions — and a value pasted
into a script unquoted runs whatever it holds as root at boot (a PEP 508 marker such as
``numpy; python_version >= '$(cmd)'`` is valid). :func:`shell_word` is the only quoting function; a
property test feeds it every requirement shape and shell metacharacter through the rendered script.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def shell_word(value: object) -> str:
    """``value`` as one shell word that expands to exactly ``str(value)`` (single-quoted unless plainly safe)."""
    return shlex.quote(str(value))


def shell_words(values: Iterable[object]) -> str:
    """Each of ``values`` as its own shell word, space-separated."""
    return " ".join(shell_word(v) for v in values)


def say_line(text: str, *, command: str = "say") -> str:
    """A script line that logs ``text`` verbatim through the script's ``say`` function (no expansion inside)."""
    return f"{command} {shell_word(text)}"
