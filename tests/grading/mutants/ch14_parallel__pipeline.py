"""Plausible wrong answers to chapter 14 (parallelism), pipeline
parallelism (14.3 gpipe_bubble / pipeline_time, 14.6 stage_order / simulate_pipeline); the
graded tests must catch each one.
Each mutant replaces the solution function named before its ``__``."""

from collections import deque

from minillm.parallel.pipeline import Event

# -- 14.3 gpipe_bubble / pipeline_time ------------------------------------------------------

def _check(stages, microbatches):
    if stages < 1 or microbatches < 1:
        raise ValueError("a pipeline needs a stage and a micro-batch")


def gpipe_bubble__over_microbatches(stages, microbatches):
    """(p − 1)/m: the idle time relative to the work, not to the whole run."""
    _check(stages, microbatches)
    return (stages - 1) / microbatches


def gpipe_bubble__off_by_one(stages, microbatches):
    """(p − 1)/(m + p): counts one stage time too many in the makespan."""
    _check(stages, microbatches)
    return (stages - 1) / (microbatches + stages)


def gpipe_bubble__busy_share(stages, microbatches):
    """m/(m + p − 1): the share of time a stage works, not the share it waits."""
    _check(stages, microbatches)
    return microbatches / (microbatches + stages - 1)


def gpipe_bubble__no_check(stages, microbatches):
    """The formula without refusing an empty pipeline (0 stages gives a negative bubble)."""
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_time__no_overlap(stage_time, stages, microbatches):
    """m·p·t: each micro-batch runs through every stage before the next one starts."""
    _check(stages, microbatches)
    return microbatches * stages * stage_time


def pipeline_time__off_by_one(stage_time, stages, microbatches):
    """(m + p)·t: one stage time too many for filling the pipeline."""
    _check(stages, microbatches)
    return (microbatches + stages) * stage_time


def pipeline_time__ignores_fill(stage_time, stages, microbatches):
    """m·t: the busy time of one stage, without the fill and drain."""
    _check(stages, microbatches)
    return microbatches * stage_time


def pipeline_time__no_check(stage_time, stages, microbatches):
    """The formula without refusing an empty pipeline."""
    return (microbatches + stages - 1) * stage_time


# -- 14.6 stage_order / simulate_pipeline ----------------------------------------------------

def _order(kind, microbatches, backward, warmup):
    if kind not in ("gpipe", "1f1b"):
        raise ValueError(f"unknown pipeline schedule {kind!r}")
    forwards = [("F", i) for i in range(microbatches)]
    backwards = [("B", i) for i in range(microbatches)]
    if not backward:
        return forwards
    if kind == "gpipe":
        return forwards + backwards
    order = forwards[:warmup]
    for i in range(microbatches - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[microbatches - warmup:]


def stage_order__warmup_p_minus_s(kind, stage, stages, microbatches, backward=True):
    """Warms up with p − s forwards instead of p − s − 1: the last stage does one forward
    before it starts alternating."""
    return _order(kind, microbatches, backward, min(stages - stage, microbatches))


def stage_order__warmup_from_the_first_stage(kind, stage, stages, microbatches,
                                             backward=True):
    """Gives stage s s warm-up forwards: the first stage alternates at once, the last
    warms up longest (the pipeline counted from the wrong end)."""
    return _order(kind, microbatches, backward, min(stage, microbatches))


def stage_order__warmup_not_capped(kind, stage, stages, microbatches, backward=True):
    """Does not cap the warm-up at m: with fewer micro-batches than p − s − 1, the
    remaining backwards are sliced from a negative index and some go missing."""
    return _order(kind, microbatches, backward, stages - stage - 1)


def _simulate(orders, forward_times, backward_times, input_of, own_stage_waits=True,
              by_stage=False):
    duration = {"F": forward_times, "B": backward_times}
    waiting = [deque(order) for order in orders]
    ended = {}
    stage_free = [0.0] * len(orders)
    events = []
    while any(waiting):
        ran = len(events)
        for stage, queue in enumerate(waiting):
            while queue:
                phase, microbatch = queue[0]
                needed = input_of(stage, phase, microbatch, len(orders) - 1)
                if needed is not None and needed not in ended:
                    break
                queue.popleft()
                start = ended.get(needed, 0.0)
                if own_stage_waits:
                    start = max(start, stage_free[stage])
                end = start + duration[phase][stage]
                ended[stage, phase, microbatch] = stage_free[stage] = end
                events.append(Event(stage, microbatch, phase, start, end))
        if len(events) == ran:
            raise ValueError("the pipeline is stuck")
    key = (lambda e: (e.stage, e.start)) if by_stage else (lambda e: (e.start, e.stage))
    return sorted(events, key=key)


def _input_of(stage, phase, microbatch, last):
    if phase == "F":
        return (stage - 1, "F", microbatch) if stage > 0 else None
    return (stage + 1, "B", microbatch) if stage < last else (stage, "F", microbatch)


def simulate_pipeline__backward_from_the_previous_stage(orders, forward_times,
                                                        backward_times):
    """Makes a backward wait for the previous stage's backward, as a forward does, when
    the gradient flows the other way: from the last stage to the first."""
    def input_of(stage, phase, microbatch, last):
        if stage == 0:
            return None if phase == "F" else (0, "F", microbatch)
        return (stage - 1, phase, microbatch)
    return _simulate(orders, forward_times, backward_times, input_of)


def simulate_pipeline__stage_never_busy(orders, forward_times, backward_times):
    """Starts each operation when its input has ended, without waiting for the stage to
    finish its previous one: a stage runs several operations at once."""
    return _simulate(orders, forward_times, backward_times, _input_of, own_stage_waits=False)


def simulate_pipeline__last_backward_waits_for_nothing(orders, forward_times,
                                                       backward_times):
    """Lets the last stage's backward start without its own forward (the loss): an order
    with B0 before F0 on the last stage runs instead of being refused."""
    def input_of(stage, phase, microbatch, last):
        if phase == "B" and stage == last:
            return None
        return _input_of(stage, phase, microbatch, last)
    return _simulate(orders, forward_times, backward_times, input_of)


def simulate_pipeline__sorted_by_stage(orders, forward_times, backward_times):
    """Returns the events stage by stage (each stage's in time order), not sorted by start
    time across the stages."""
    return _simulate(orders, forward_times, backward_times, _input_of, by_stage=True)


def simulate_pipeline__first_stage_times(orders, forward_times, backward_times):
    """Uses stage 0's forward and backward times for every stage: a slow stage is not
    slow."""
    stages = len(orders)
    return _simulate(orders, [forward_times[0]] * stages, [backward_times[0]] * stages,
                     _input_of)
