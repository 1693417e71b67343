"""What must never be written where others read it: user-data, the serial console, logs, journals, uploads.

One list of credential-like patterns serves the three uses: :func:`assert_no_credentials` refuses to write a
text that holds one, :func:`redact` blanks them out of a message (a cloud's error text), and
:func:`refuse_requirement_credentials` stops a spec requirement that carries a login in its URL before anything
is planned or started.
"""

from __future__ import annotations

import re

from rubberband.errors import InputError

#: A login in a URL (``scheme://user:secret@host``, ``https://TOKEN@host``); ``git@`` (an SSH user) is no secret.
URL_LOGIN_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?!git@)[^\s/@'\"]+@")
#: Things that must never appear in user-data, logs or journals.
CREDENTIAL_PATTERNS = (
    URL_LOGIN_RE,
    re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"aws_secret_access_key|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN", re.I),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r'"private_key"\s*:'),  # GCP service-account key files
    re.compile(r"\bya29\.[0-9A-Za-z_-]{10,}"),  # Google OAuth access tokens
)


def redact(text: str) -> str:
    """Replace anything credential-like in ``text`` (e.g. a provider's error message) with ``[redacted]``."""
    for pattern in CREDENTIAL_PATTERNS:
        text = pattern.sub("[redacted]", text)
    return text


def assert_no_credentials(text: str, *, what: str = "startup script") -> str:
    """Raise if ``text`` contains anything that looks like a credential; return it unchanged otherwise."""
    for pattern in CREDENTIAL_PATTERNS:
        if pattern.search(text):
            raise InputError(
                f"refusing to write a {what} that contains a credential-like string "
                f"(pattern {pattern.pattern!r}); credentials come from the instance role"
            )
    return text


def refuse_requirement_credentials(requirement: str) -> str:
    """Refuse a requirement whose URL carries a login (``pkg @ https://user:token@host/...``): it would land in
    every node's user-data and console log. Private indexes belong in the image's pip config (``/etc/pip.conf``)."""
    if URL_LOGIN_RE.search(requirement):
        raise InputError(
            f"requirement {requirement!r} carries a login in its URL, which would be written into every node's "
            f"user-data and console log; put private index credentials in the image's pip config (/etc/pip.conf, "
            f"see docs/clouds.md) and name the package alone"
        )
    return requirement
