"""Parallelism on torch.distributed (chapter 14).

* :mod:`.layers` — column- and row-parallel linears, the vocabulary-parallel embedding
  and head: each calls its collective in its own forward (Megatron);
* :mod:`.tensor` — tensor parallelism as a transformation: a rank's model from the whole;
* :mod:`.loading` — each rank reads only its shard of the checkpoint (the engine on
  several processes, ``LLM(tensor_parallel_size=N)``, is :mod:`minillm.engine.parallel_runner`);
* :mod:`.sequence` — sequence parallelism over the norm regions (Korthikanti et al.);
* :mod:`.experts` — expert parallelism: each rank holds part of an MoE layer's experts and
  tokens travel to them with ``all_to_all``;
* :mod:`.pipeline` — pipeline stages, GPipe and 1F1B schedules, the bubble;
* :mod:`.cost` — communication volume and time on real interconnects;
* :mod:`.launch` / :mod:`.programs` — starting ranks, and what they run in the chapter.
"""

from .layers import COLLECTIVES
from .loading import load_shard
from .pipeline import pipeline_forward, pipeline_stage, schedule
from .sequence import sequence_parallel
from .tensor import shard_weight, tensor_parallel

__all__ = ["COLLECTIVES", "load_shard", "pipeline_forward", "pipeline_stage", "schedule",
           "sequence_parallel", "shard_weight", "tensor_parallel"]
