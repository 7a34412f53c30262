"""The engine core: what runs each step, and how (part IV).

    client (generate() · LLM · the HTTP server · speculative_generate)
      └─ output processor: deltas -> text, stop strings       (minillm.serve)
           └─ EngineCore: add / abort / step() -> deltas       (core.py)
                ├─ Scheduler + BlockManager: what runs         (scheduler.py, block_manager.py)
                ├─ Proposer: guesses for speculation           (proposers.py)
                └─ ModelRunner: how it is laid out             (runner.py)
                     └─ executor: eager | compiled | native    (executors/)
                          └─ model: forward_flat over the paged pool

The core's sequences never leave it: clients get immutable
:class:`~.deltas.RequestDelta` s, and observers a :class:`~.deltas.StepReport` per step.
"""

from .config import EngineConfig
from .core import EngineCore, RequestRejected
from .deltas import RequestDelta, StepReport
from .errors import EngineDeadError
from .scheduler import SchedulerConfig

__all__ = ["EngineConfig", "EngineCore", "EngineDeadError", "RequestDelta", "RequestRejected",
           "SchedulerConfig", "StepReport"]
