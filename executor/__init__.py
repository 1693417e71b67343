"""rubberband.executor: runs a plan on elastic instances and records everything it does.

* :mod:`~rubberband.executor.controller` — the SHA / Hyperband controller (placement, promotion,
  resizes, elastic allocation, re-planning, teardown);
* :mod:`~rubberband.executor.runtime` — the seams: the trial runtime (``TrialSpec`` / ``TrialRun``
  of ``executor/trials.py``) and the re-planner;
* :mod:`~rubberband.executor.journal` — the append-only run journal, its fold (the run's state, kept live
  for the controller), its reader and the sink actor; :mod:`~rubberband.executor.events` — its typed events;
* :mod:`~rubberband.executor.accounting` and :mod:`~rubberband.executor.result` — bills and result.json;
* :mod:`~rubberband.executor.placement`, :mod:`~rubberband.executor.backends`,
  :mod:`~rubberband.executor.progress` — slots, backend lookup, the progress display.
"""
