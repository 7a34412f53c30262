"""Serving many requests at once: paged KV blocks, prefix caching, scheduling (part IV).

``LLM(model).generate(prompts, SamplingParams(max_tokens=...))`` is the offline API;
``add_request`` / ``step`` / ``stream`` / ``abort`` the online one.
"""

from .llm import LLM, RequestOutput
from .scheduler import SchedulerConfig

__all__ = ["LLM", "RequestOutput", "SchedulerConfig"]
