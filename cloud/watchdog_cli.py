"""``python -m rubberband.cloud.watchdog_cli watchdog ...``: the run watchdog's command line on a run's head.

The watchdog itself (what it watches, when it ends the run) is :func:`rubberband.cloud.head.watch`; this entry point
only parses its flags and builds the provider it ends the run through, from the registry (it sits above the
clouds' packages, as everything that asks the registry does).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rubberband.cloud.head import (
    NoApi,
    RunEnder,
    WatchdogSettings,
    WatchedRun,
    power_off_now,
    log,
    request_poweroff,
    watch,
)
from rubberband.cloud.registry import CLOUD_PROVIDERS, make_provider


def add_head_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that name a run's head on the head's own command lines (watchdog, run job)."""
    parser.add_argument("--cloud", required=True, choices=CLOUD_PROVIDERS)
    parser.add_argument("--region", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--head-id", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The watchdog's command line (the head's startup script writes it)."""
    parser = argparse.ArgumentParser(prog="python -m rubberband.cloud.watchdog_cli")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watchdog", help="terminate the run when it is idle, stalled, finished or too old")
    add_head_arguments(w)
    w.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="the run directory to watch (default: the head's run root / the run id)",
    )
    defaults = WatchdogSettings()
    w.add_argument("--submit-timeout", type=float, default=defaults.submit_timeout_s)
    w.add_argument("--stall-timeout", type=float, default=defaults.stall_timeout_s)
    w.add_argument("--done-grace", type=float, default=defaults.done_grace_s)
    w.add_argument("--max-lifetime", type=float, default=defaults.max_lifetime_s)
    w.add_argument("--poll", type=float, default=defaults.poll_s)
    w.add_argument("--no-shutdown", action="store_true", help="never power off this machine (tests, debugging)")
    w.add_argument(
        "--poweroff-marker",
        action="store_true",
        help="instead of powering off, ask the head's boot script to (the watchdog as a Ray job)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m rubberband.cloud.watchdog_cli watchdog ...`` (run by the head's startup script)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = WatchdogSettings(
        submit_timeout_s=args.submit_timeout,
        stall_timeout_s=args.stall_timeout,
        done_grace_s=args.done_grace,
        max_lifetime_s=args.max_lifetime,
        poll_s=args.poll,
    )
    provider: RunEnder
    try:
        provider = make_provider(args.cloud, args.region)
    except Exception as exc:  # noqa: BLE001 - watch anyway; ending the run then falls back to a shutdown
        log.warning("no %s API access for the watchdog (%s): it will shut the head down instead", args.cloud, exc)
        provider = NoApi(args.cloud, str(exc))
    if args.run_dir is None:
        from rubberband.cloud.bootstrap import head_run_dir

        args.run_dir = head_run_dir(args.run_id)
    shutdown = (
        (lambda: None)
        if args.no_shutdown
        else request_poweroff(args.run_dir)
        if args.poweroff_marker
        else power_off_now
    )
    decision = watch(WatchedRun(provider, args.run_id, args.head_id, args.run_dir), settings, shutdown=shutdown)
    print(f"rubberband watchdog: ended run {args.run_id}: {decision.reason}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
