"""The course's measured experiments, shared by its notebooks and ``benchmarks/``.

* :mod:`.workload` — request traces (real prompts, Poisson arrivals, long-tailed lengths)
  and replaying one in real time against an engine;
* :mod:`.decode` — the decode-speed table (``minillm bench``, ``benchmarks/decode.py``);
* :mod:`.capstone` — chapter 15's techniques switched on one at a time on one trace;
* :mod:`.verification` — r(n), the cost of verifying n tokens of one sequence
  (``benchmarks/verification_cost.py``);
* :mod:`.kv_rounding` — attention through a rounded (int8, int4) KV cache in the engine,
  with any quantizer: chapter 12's section 9 passes the learner's beside the library's.
* :mod:`.self_distillation` — a draft head's training data: the engine's answers to chat
  prompts and the target's features over them (``minillm train-draft-head``, the lab below);
* :mod:`.draft_head_lab` — chapter 11's lab: a draft head trained by the learner's step
  beside the library's, then drafting in the engine.

They sit above every other layer of the library (they use the engine, the clients and
the quantizers as a user would) and nothing in the library imports them.
"""
