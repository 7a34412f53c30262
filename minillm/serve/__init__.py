"""The engine's clients (part IV): the ``LLM`` front end, the asyncio engine and the HTTP
server, over the engine core (:mod:`minillm.engine`).

``LLM(model).generate(prompts, SamplingParams(max_tokens=...))`` is the offline API;
``add_request`` / ``step`` / ``stream`` / ``abort`` the online one.
"""

from ..engine.config import EngineConfig
from ..engine.scheduler import SchedulerConfig
from .llm import LLM
from .output_processor import CompletionOutput, RequestOutput, Update

__all__ = ["LLM", "CompletionOutput", "EngineConfig", "RequestOutput", "SchedulerConfig",
           "Update"]
