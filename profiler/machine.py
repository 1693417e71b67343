"""What the profile was measured on: host, CPU model, cores, library versions; start-up defaults."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

#: Start-up latency (request → ready to run a worker) per cloud when not measured, in seconds.
#: Origin: typical EC2 / GCE GPU VM boot + image + Ray join times (AWS 60–150 s, GCP 40–100 s);
#: a local Ray node on this machine starts in a few seconds. Profiles mark them ``source: default``.
DEFAULT_STARTUP_S: dict[str, tuple[float, ...]] = {
    "aws": (62.0, 75.0, 84.0, 92.0, 100.0, 108.0, 118.0, 130.0, 148.0),
    "gcp": (42.0, 50.0, 57.0, 63.0, 70.0, 78.0, 86.0, 98.0),
    "local": (1.5, 2.0, 2.5, 3.0),
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """Facts about this machine for the profile's ``machine`` field."""
    import ray
    import torch

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count() or 1,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray_version": ray.__version__,
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return info
