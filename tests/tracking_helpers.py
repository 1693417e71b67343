"""Reading what the trackers wrote: TensorBoard event files (TFRecord framing around tensorboardX's protobufs,
read without TensorBoard itself) and a stand-in MLflow client that keeps every call."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``logdir``: tag → [(step, value)] in the order written."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])  # length, its CRC, the record, the record's CRC
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


@dataclass
class FakeMlflow:
    """The MlflowClient methods MlflowSink calls, recorded: runs with their params, metrics, tags and status."""

    experiments: dict[str, str] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    fail_on: str | None = None  # a method name that raises (a server gone)

    def _maybe_fail(self, name: str) -> None:
        if self.fail_on == name:
            raise ConnectionError(f"{name}: the tracking server went away")

    def get_experiment_by_name(self, name: str) -> Any:
        found = self.experiments.get(name)
        return None if found is None else SimpleNamespace(experiment_id=found)

    def create_experiment(self, name: str) -> str:
        self.experiments[name] = str(len(self.experiments) + 1)
        return self.experiments[name]

    def create_run(self, experiment_id: str, *, start_time: int, tags: dict, run_name: str) -> Any:
        self._maybe_fail("create_run")
        run_id = f"r{len(self.runs)}"
        self.runs[run_id] = {
            "experiment_id": experiment_id,
            "name": run_name,
            "tags": dict(tags),
            "params": {},
            "metrics": {},
            "status": "RUNNING",
        }
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))

    def log_metric(self, run_id: str, key: str, value: float, timestamp: int, step: int) -> None:
        self._maybe_fail("log_metric")
        self.runs[run_id]["metrics"].setdefault(key, []).append((step, value))

    def log_param(self, run_id: str, key: str, value: str) -> None:
        self.runs[run_id]["params"][key] = value

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.runs[run_id]["tags"][key] = value

    def update_run(self, run_id: str, status: str) -> None:
        self.runs[run_id]["status"] = status

    def set_terminated(self, run_id: str, status: str, end_time: int) -> None:
        self.runs[run_id]["status"] = status
