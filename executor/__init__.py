"""rubberband.executor: runs a plan on elastic instances and records everything it does.

* :mod:`~rubberband.executor.run` — the :class:`~rubberband.executor.run.Executor`: one loop
  (:mod:`~rubberband.executor.loop`) driving a :class:`~rubberband.executor.scheduling.Scheduler` (SHA / Hyperband
  lanes in :mod:`~rubberband.executor.sha`, ASHA in :mod:`~rubberband.executor.asha`) over a
  :class:`~rubberband.executor.cluster.Cluster` (real Ray or simulated); its decisions are journaled events and
  the run's state their fold (:mod:`~rubberband.executor.runstate`); docs/executor.md tells how it is built;
* :mod:`~rubberband.executor.runtime` — the seams: the trial runtime (``TrialSpec`` / ``TrialRun``
  of ``executor/trials.py``) and the re-planner;
* :mod:`~rubberband.executor.journal` — the append-only run journal, its fold (the run's state, kept live
  for the executor), its reader and the sink actor; :mod:`~rubberband.executor.events` — its typed events;
* :mod:`~rubberband.executor.accounting` and :mod:`~rubberband.executor.result` — bills and result.json;
* :mod:`~rubberband.executor.placement`, :mod:`~rubberband.executor.backends`,
  :mod:`~rubberband.executor.progress` — slots, backend lookup, the progress display.
"""
