"""r(n), the cost of verifying n tokens of one sequence (benchmarks/verification_cost.py), on
the tiny random model with one repeat: the table's shape and r(1) = 1, no timed claims."""

from __future__ import annotations

import pytest

from minillm.config import ModelConfig
from minillm.engine.executors.compiled import compile_problem
from minillm.engine.executors.native import native_problem
from minillm.engine.runner import ModelRunner
from minillm.experiments.verification import (
    cost_table,
    measure_row,
    verification_batch,
    weight_format,
)
from minillm.testing import TINY, varied_random_model


@pytest.fixture(scope="module")
def tiny():
    return varied_random_model(ModelConfig(**TINY))


@pytest.mark.parametrize("weights", ["fp32", "W8A8"])
def test_a_row_has_one_time_per_n_and_r1_is_one(tiny, weights):
    model = weight_format(tiny, weights)
    executors = ["eager"] + (["native"] if native_problem(model) is None else [])
    rows = [measure_row(model, executor, weights, max_n=4, context=20, repeats=1, calls=1,
                        warmup=0) for executor in executors]
    for row, executor in zip(rows, executors, strict=True):
        assert len(row.seconds) == 1 and len(row.seconds[0]) == 4
        assert all(t > 0 for t in row.seconds[0])
        assert row.ratio(1) == (1.0, 1.0, 1.0)
        assert row.ran_on == (executor,) * 4  # native verifies too; eager runs everything
    table = cost_table(rows, {"compiled / x": "not measured here"}).splitlines()
    assert table[0].count("| r(") == 4
    assert len(table) == 2 + len(rows) + 1
    assert len({line.count("|") for line in table}) == 1  # every line has every column
    assert all(" | 1.00 | " in line for line in table[2:2 + len(rows)])


def test_the_compiled_executor_verifies_eagerly(tiny):
    """Its graphs are decode-only: a pass over n > 1 tokens falls to the eager executor,
    and the row says so (checked through the runner's choice, without compiling)."""
    if compile_problem(tiny) is not None:
        pytest.skip(compile_problem(tiny))
    runner = ModelRunner(tiny, num_blocks=4, block_size=16, executor="compiled")
    names = [runner.executor_for(verification_batch(runner, [1] * n, 20, [1, 2])).name
             for n in (1, 2, 8)]
    assert names == ["compiled", "eager", "eager"]


def test_a_context_past_the_model_is_refused(tiny):
    with pytest.raises(ValueError, match="past the model"):
        measure_row(tiny, "eager", context=TINY["max_position_embeddings"], max_n=2)
