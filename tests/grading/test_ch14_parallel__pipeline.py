"""Graded tests for chapter 14 (parallelism): pipeline parallelism, exercises 14.3 (the
pipeline bubble) and 14.6 (a pipeline schedule builder).

Oracle: the library's pipeline simulator, ``minillm.parallel.pipeline`` (``schedule``,
``bubble_fraction``, ``stage_order``, ``peak_in_flight``).
"""

from __future__ import annotations

import copy
import random

import pytest

from minillm.grading import load_impl
from minillm.parallel import pipeline as library_pipeline

impl = load_impl("ch14_parallel")


# -- 14.3 the pipeline bubble -------------------------------------------------------------

@pytest.mark.exercise("14.3", points=1)
@pytest.mark.parametrize("stages, microbatches, expected", [
    (1, 8, 0.0),  # one stage never waits
    (2, 1, 0.5),  # one micro-batch: (p - 1)/p
    (4, 1, 0.75),
    (2, 8, 1 / 9),
    (4, 4, 3 / 7),
])
def test_gpipe_bubble_examples(stages, microbatches, expected):
    assert impl.gpipe_bubble(stages, microbatches) == pytest.approx(expected, abs=1e-12)


@pytest.mark.exercise("14.3", points=1)
def test_gpipe_bubble_matches_the_simulated_pipeline():
    for stages in range(1, 7):
        for microbatches in range(1, 11):
            events = library_pipeline.schedule("gpipe", stages, microbatches)
            simulated = library_pipeline.bubble_fraction(events)
            got = impl.gpipe_bubble(stages, microbatches)
            assert got == pytest.approx(simulated, abs=1e-12), (stages, microbatches)
            assert got == pytest.approx(library_pipeline.gpipe_bubble(stages, microbatches))


@pytest.mark.exercise("14.3", points=1)
def test_pipeline_time_matches_the_simulated_makespan():
    for stage_time in (1.0, 2.5):
        for stages in range(1, 6):
            for microbatches in range(1, 9):
                events = library_pipeline.schedule("gpipe", stages, microbatches,
                                                   forward_time=stage_time)
                makespan = max(e.end for e in events)
                got = impl.pipeline_time(stage_time, stages, microbatches)
                assert got == pytest.approx(makespan), (stage_time, stages, microbatches)


@pytest.mark.exercise("14.3", points=1)
@pytest.mark.parametrize("stages, microbatches", [(0, 4), (3, 0), (-1, 2)])
def test_an_empty_pipeline_is_refused(stages, microbatches):
    with pytest.raises(ValueError):
        impl.gpipe_bubble(stages, microbatches)
    with pytest.raises(ValueError):
        impl.pipeline_time(1.0, stages, microbatches)

# -- 14.6 a pipeline schedule builder --------------------------------------------------------

Event = library_pipeline.Event


def library_orders(kind, stages, microbatches, backward=True):
    return [library_pipeline.stage_order(kind, s, stages, microbatches, backward)
            for s in range(stages)]


def orders_of(text):
    """'F0 F1 B0' -> [("F", 0), ("F", 1), ("B", 0)]."""
    return [(op[0], int(op[1:])) for op in text.split()]


@pytest.mark.exercise("14.6", points=2)
@pytest.mark.parametrize("kind, stage, stages, microbatches, expected", [
    ("gpipe", 0, 2, 3, "F0 F1 F2 B0 B1 B2"),
    ("gpipe", 3, 4, 2, "F0 F1 B0 B1"),
    ("1f1b", 0, 4, 6, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"),  # 3 warm-up forwards
    ("1f1b", 1, 4, 6, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"),  # 2
    ("1f1b", 3, 4, 6, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"),  # the last stage: none
    ("1f1b", 0, 4, 2, "F0 F1 B0 B1"),  # fewer micro-batches than warm-up forwards
    ("1f1b", 1, 4, 2, "F0 F1 B0 B1"),
    ("1f1b", 0, 1, 3, "F0 B0 F1 B1 F2 B2"),  # one stage
])
def test_stage_order_examples(kind, stage, stages, microbatches, expected):
    assert impl.stage_order(kind, stage, stages, microbatches) == orders_of(expected)


@pytest.mark.exercise("14.6", points=1)
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_inference_runs_only_the_forwards(kind):
    for stage in range(4):
        assert impl.stage_order(kind, stage, 4, 5, backward=False) == orders_of("F0 F1 F2 F3 F4")


@pytest.mark.exercise("14.6", points=1)
def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError):
        impl.stage_order("interleaved", 0, 4, 8)


@pytest.mark.exercise("14.6", points=2)
def test_stage_order_matches_the_library():
    for kind in library_pipeline.SCHEDULES:
        for stages in range(1, 8):
            for microbatches in range(1, 11):
                for stage in range(stages):
                    for backward in (True, False):
                        args = (kind, stage, stages, microbatches, backward)
                        assert impl.stage_order(*args) == \
                            library_pipeline.stage_order(*args), args


@pytest.mark.exercise("14.6", points=2)
def test_simulate_pipeline_1f1b_by_hand():
    """2 stages, 2 micro-batches, forward 1, backward 2 (worked out by hand)."""
    orders = [orders_of("F0 F1 B0 B1"), orders_of("F0 B0 F1 B1")]
    expected = [Event(0, 0, "F", 0, 1), Event(0, 1, "F", 1, 2),
                Event(1, 0, "F", 1, 2),  # needs stage 0's F0
                Event(1, 0, "B", 2, 4),  # the last stage: needs its own F0
                Event(0, 0, "B", 4, 6),  # needs stage 1's B0
                Event(1, 1, "F", 4, 5),  # stage 1 is busy with B0 until 4
                Event(1, 1, "B", 5, 7),
                Event(0, 1, "B", 7, 9)]
    assert impl.simulate_pipeline(orders, [1.0, 1.0], [2.0, 2.0]) == expected


@pytest.mark.exercise("14.6", points=2)
def test_a_slow_stage_sets_the_pace():
    """Inference over 3 stages, the middle one 3 times slower: stage 2 waits for it."""
    orders = [orders_of("F0 F1 F2")] * 3
    expected = [Event(0, 0, "F", 0, 1), Event(0, 1, "F", 1, 2), Event(1, 0, "F", 1, 4),
                Event(0, 2, "F", 2, 3), Event(1, 1, "F", 4, 7), Event(2, 0, "F", 4, 5),
                Event(1, 2, "F", 7, 10), Event(2, 1, "F", 7, 8), Event(2, 2, "F", 10, 11)]
    assert impl.simulate_pipeline(orders, [1.0, 3.0, 1.0], [0.0, 0.0, 0.0]) == expected


@pytest.mark.exercise("14.6", points=3)
def test_simulate_pipeline_matches_the_library_on_random_pipelines():
    """Random stage counts, micro-batches and per-stage times (multiples of 1/4, so every
    sum is exact): the same events as ``schedule``, in the same order."""
    rng = random.Random(14)
    for _ in range(200):
        kind = rng.choice(library_pipeline.SCHEDULES)
        stages, microbatches = rng.randint(1, 6), rng.randint(1, 9)
        forward = [rng.randint(1, 8) / 4 for _ in range(stages)]
        training = rng.random() < 0.7
        backward = [rng.randint(1, 12) / 4 if training else 0.0 for _ in range(stages)]
        orders = library_orders(kind, stages, microbatches, training)
        before = copy.deepcopy(orders)
        got = impl.simulate_pipeline(orders, forward, backward)
        expected = library_pipeline.schedule(kind, stages, microbatches, forward, backward)
        assert orders == before, "simulate_pipeline changed the orders it was given"
        assert all(isinstance(e, Event) for e in got), "return pipeline.Event objects"
        assert got == expected, (kind, stages, microbatches, forward, backward)


@pytest.mark.exercise("14.6", points=1)
def test_orders_that_wait_for_each_other_are_refused():
    """The last stage's B0 before its own F0 can never run (and the first stage waits)."""
    orders = [orders_of("F0 B0"), orders_of("B0 F0")]
    with pytest.raises(ValueError):
        impl.simulate_pipeline(orders, [1.0, 1.0], [2.0, 2.0])


@pytest.mark.exercise("14.6", points=2)
@pytest.mark.parametrize("stages, microbatches", [(2, 1), (2, 8), (4, 6), (4, 16), (6, 3)])
def test_your_schedules_hold_what_1f1b_promises(stages, microbatches):
    """Your builder end to end: GPipe holds all m micro-batches' activations on every
    stage, 1F1B at most p (p − s on stage s); with equal stage times both have GPipe's
    bubble (p − 1)/(m + p − 1), in training and in inference."""
    p, m = stages, microbatches
    for kind in library_pipeline.SCHEDULES:
        orders = [impl.stage_order(kind, s, p, m) for s in range(p)]
        events = impl.simulate_pipeline(orders, [1.0] * p, [2.0] * p)
        peaks = [library_pipeline.peak_in_flight(events, s) for s in range(p)]
        assert peaks == ([m] * p if kind == "gpipe" else [min(p - s, m) for s in range(p)]), \
            (kind, peaks)
        bubble = library_pipeline.bubble_fraction(events)
        assert bubble == pytest.approx(library_pipeline.gpipe_bubble(p, m)), kind
        orders = [impl.stage_order(kind, s, p, m, backward=False) for s in range(p)]
        events = impl.simulate_pipeline(orders, [1.0] * p, [0.0] * p)
        assert library_pipeline.bubble_fraction(events) == \
            pytest.approx(library_pipeline.gpipe_bubble(p, m)), kind
