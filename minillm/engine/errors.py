"""What can go wrong inside the engine, as the engine's clients see it.

A step that raises fails only the requests it was computing: they finish with
``finish_reason`` "error" and a message, their blocks go back to the pool, and the engine
serves the others. When the engine itself can no longer compute (a tensor-parallel worker
died, or a step did not finish in time), it raises :class:`EngineDeadError`: every request
fails with that reason, and a server says so on ``/health`` instead of waiting forever.
"""


class EngineDeadError(RuntimeError):
    """The engine cannot run another step; the message says why and what to do."""
