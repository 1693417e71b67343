"""Test harness hook: stand in for a cloud instance's boot with a local Ray node.

The ONE place that reads ``RUBBERBAND_TEST_BOOT``. With ``RUBBERBAND_TEST_BOOT=local`` the
executor's cloud backend (``cloud/local_head.py``), once the provider (a moto server or the GCE
fake in tests) reports an instance running, plays the instance's user-data itself: it starts a
local Ray node that offers the instance's ``rb-node-<id>`` resource and joins the run's head,
exactly what the bootstrap script would do on the instance. Terminating the instance stops that
node too. Never set it outside tests: no real instance would ever join.
"""

from __future__ import annotations

import os

from rubberband.errors import InputError

TEST_BOOT_ENV = "RUBBERBAND_TEST_BOOT"
MODES = ("local",)


def boot_mode() -> str | None:
    """``"local"`` when the test harness plays instances' boots with local Ray nodes; else None."""
    value = os.environ.get(TEST_BOOT_ENV, "").strip()
    if not value:
        return None
    if value not in MODES:
        raise InputError(f"{TEST_BOOT_ENV}={value!r} is not a test boot mode; use one of {', '.join(MODES)} "
                         f"or unset it")
    return value
