"""The grading machinery itself: stub generation, the grader's table, hostile student code,
and the mutants that prove the graded tests catch wrong answers."""

from __future__ import annotations

import textwrap

import pytest

from minillm.grading import load_impl
from minillm.grading.exercises import make_exercise
from minillm.grading.grade import (
    merge_mutant_reports,
    mutant_summary,
    run_graded_tests,
    run_mutants,
    score_table,
)
from minillm.grading.mutants import find_mutants, graded_module, mutant_function

SOLUTION = textwrap.dedent('''
    import math


    def area(r: float) -> float:
        """Exercise 99.1: Return the area of a circle of radius r.

        Hint: math.pi.
        """
        ### BEGIN SOLUTION
        return math.pi * r * r
        ### END SOLUTION


    def helper():
        return 1
''')


def test_stub_keeps_signature_docstring_and_helpers():
    stub = make_exercise(SOLUTION, "ch99_demo.py")
    assert 'raise NotImplementedError("Exercise 99.1: Return the area of a circle of radius r")' \
        in stub
    assert "def area(r: float) -> float:" in stub and "Hint: math.pi." in stub
    assert "math.pi * r * r" not in stub and "BEGIN SOLUTION" not in stub
    assert "def helper():\n    return 1" in stub
    namespace = {}
    exec(stub, namespace)
    with pytest.raises(NotImplementedError, match="Exercise 99.1"):
        namespace["area"](1.0)


@pytest.mark.parametrize("broken, message", [
    (SOLUTION.replace("    ### END SOLUTION\n", ""), "never closed"),
    (SOLUTION.replace("Exercise 99.1: ", ""), "Exercise NN.k"),
    (SOLUTION.replace("    ### BEGIN SOLUTION\n", ""), "without"),
])
def test_malformed_markers_are_reported(broken, message):
    with pytest.raises(ValueError, match=message):
        make_exercise(broken, "ch99_demo.py")


STUDENT = textwrap.dedent('''
    def good(x):
        return x + 1

    def wrong(x):
        return x

    def loops(x):
        while True:
            pass

    def crashes(x):
        return [1, 2][5]
''')

GRADED = textwrap.dedent('''
    import pytest
    from student import good, wrong, loops, crashes

    @pytest.mark.exercise("99.1", points=2)
    def test_good():
        assert good(1) == 2

    @pytest.mark.exercise("99.2")
    def test_wrong():
        assert wrong(1) == 2, "wrong(1) should be 2"

    @pytest.mark.exercise("99.3")
    def test_loops():
        assert loops(1) == 2

    @pytest.mark.exercise("99.4")
    def test_crashes():
        assert crashes(1) == 2
''')

CONFTEST = textwrap.dedent('''
    import sys, pathlib
    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent))
    def pytest_addoption(parser):
        parser.addoption("--impl", default=None)
''')


def fake_course(tmp_path, student_code):
    (tmp_path / "tests" / "grading").mkdir(parents=True)
    (tmp_path / "student.py").write_text(student_code)
    (tmp_path / "tests" / "conftest.py").write_text(CONFTEST)
    (tmp_path / "tests" / "grading" / "test_ch99_demo.py").write_text(GRADED)
    return tmp_path


def test_grader_survives_wrong_answers_endless_loops_and_crashes(tmp_path):
    results = run_graded_tests("99", timeout=3, root=fake_course(tmp_path, STUDENT))
    outcome = {r["exercise"]: r for r in results}
    assert outcome["99.1"]["outcome"] == "passed" and outcome["99.1"]["points"] == 2
    assert "should be 2" in outcome["99.2"]["reason"]
    assert "Timeout" in outcome["99.3"]["reason"]
    assert "IndexError" in outcome["99.4"]["reason"]
    table = score_table(results)
    assert "total       2.0 / 5.0" in table and table.count("FAIL") == 3


def test_grader_reports_a_syntax_error_readably(tmp_path):
    results = run_graded_tests("99", root=fake_course(tmp_path, "def good(x) return x\n"))
    assert len(results) == 1 and results[0]["test"] == "(import)"
    assert "SyntaxError" in results[0]["reason"] or "invalid syntax" in results[0]["reason"]


MUTANTS = textwrap.dedent('''
    import torch


    def magnitude_mask__same_as_solution(weight, sparsity):
        """Not a mistake at all: the solution's own code, so no graded test can fail."""
        num_pruned = round(sparsity * weight.numel())
        smallest_first = weight.abs().flatten().sort(stable=True).indices
        mask = torch.ones(weight.numel(), dtype=torch.bool)
        mask[smallest_first[:num_pruned]] = False
        return mask.reshape(weight.shape)


    def magnitude_mask__endless_loop(weight, sparsity):
        """Never returns."""
        while True:
            pass


    def mask_2_4__keeps_everything(weight):
        """Prunes nothing."""
        return torch.ones_like(weight, dtype=torch.bool)


    def helper_without_double_underscore():
        return 1
''')


def test_check_mutants_reports_survivors_timeouts_and_too_few_mutants(tmp_path):
    (tmp_path / "ch09_sparsity.py").write_text(MUTANTS)
    results = run_mutants("9", timeout=3, mutants_dir=tmp_path)
    outcome = {r["name"]: r for r in results}
    assert set(outcome) == {"magnitude_mask__same_as_solution", "magnitude_mask__endless_loop",
                            "mask_2_4__keeps_everything"}
    assert outcome["magnitude_mask__same_as_solution"]["killed_by"] is None
    assert outcome["magnitude_mask__same_as_solution"]["tests"] > 0
    assert "Timeout" in outcome["magnitude_mask__endless_loop"]["killed_by"]
    assert outcome["mask_2_4__keeps_everything"]["exercise"] == "09.2"
    assert outcome["mask_2_4__keeps_everything"]["killed_by"]

    lines, ok = mutant_summary(results, ["09.1", "09.2", "09.3"])
    assert not ok
    assert lines[0].startswith("SURVIVES 09.1 ch09_sparsity.magnitude_mask__same_as_solution")
    assert "TOO FEW MUTANTS 09.2: 1" in lines[1] and "TOO FEW MUTANTS 09.3: 0" in lines[2]
    assert lines[-1] == "mutants killed: 2 of 3 (>= 2 per exercise: no)"


def test_mutant_summary_passes_when_every_mutant_is_killed():
    results = [{"module": "ch99_demo", "name": f"area__{i}", "exercise": "99.1",
                "mistake": "wrong", "tests": 1, "killed_by": "test_area: assert False"}
               for i in range(2)]
    assert mutant_summary(results, ["99.1"]) == (
        ["mutants killed: 2 of 2 (>= 2 per exercise: yes)"], True)


def test_a_mutant_impl_replaces_one_function_in_a_copy_of_the_solutions():
    solutions = load_impl("ch09_sparsity", "solutions")
    mutated = load_impl("ch09_sparsity", "mutant:ch09_sparsity:mask_2_4__topk")
    assert mutated is not solutions and mutated.mask_2_4.__name__ == "mask_2_4__topk"
    assert mutated.magnitude_mask.__name__ == "magnitude_mask", "the rest is the solution"
    assert solutions.mask_2_4.__name__ == "mask_2_4", "the solutions module is left alone"
    other = load_impl("ch01_anatomy", "mutant:ch09_sparsity:mask_2_4__topk")
    assert other is load_impl("ch01_anatomy", "solutions")
    with pytest.raises(ValueError, match="no mutant"):
        load_impl("ch09_sparsity", "mutant:ch09_sparsity:not_a_mutant")
    with pytest.raises(ValueError, match="mutant:chNN_topic:name"):
        load_impl("ch09_sparsity", "solution")


def test_mutants_must_name_an_exercise_function_and_their_mistake(tmp_path):
    (tmp_path / "ch09_sparsity.py").write_text('def not_a_function__typo(w):\n    """x"""\n')
    with pytest.raises(ValueError, match="not an exercise"):
        find_mutants("ch09_sparsity", tmp_path)
    (tmp_path / "ch09_sparsity.py").write_text("def mask_2_4__no_docstring(w):\n    return w\n")
    with pytest.raises(ValueError, match="docstring"):
        find_mutants("ch09_sparsity", tmp_path)


def test_a_module_s_tests_and_mutants_may_be_split_into_parts(tmp_path):
    """``test_<module>__<part>.py`` grades solutions/<module>.py, and the mutants of
    ``mutants/<module>__<part>.py`` are the module's too, after those of <module>.py."""
    assert graded_module("tests/grading/test_ch09_sparsity.py") == "ch09_sparsity"
    assert graded_module("tests/grading/test_ch14_parallel__pipeline.py") == "ch14_parallel"
    (tmp_path / "ch09_sparsity.py").write_text(
        'def mask_2_4__first(w):\n    """First."""\n    return w\n')
    (tmp_path / "ch09_sparsity__more.py").write_text(
        'def _helper():\n    return 2\n\n\n'
        'def magnitude_mask__second(w, s):\n    """Second."""\n    return _helper()\n')
    (tmp_path / "ch09_sparsity_other.py").write_text("def not__a_part(w):\n    return w\n")
    mutants = find_mutants("ch09_sparsity", tmp_path)
    assert [(m.name, m.exercise, m.path.name) for m in mutants] == [
        ("mask_2_4__first", "09.2", "ch09_sparsity.py"),
        ("magnitude_mask__second", "09.1", "ch09_sparsity__more.py")]
    assert mutant_function(mutants[1])(None, 0.5) == 2, "imported from its own file"
    (tmp_path / "ch09_sparsity__again.py").write_text(
        'def mask_2_4__first(w):\n    """Again."""\n    return w\n')
    with pytest.raises(ValueError, match="also in"):
        find_mutants("ch09_sparsity", tmp_path)


def test_a_mutant_killed_in_one_part_stays_killed_whatever_the_other_worker_reports():
    """Two workers run two parts of one module's tests: the part that kills the mutant
    must win, whichever report comes last (a plain dict update let the survivor's win)."""
    killed = {"ch16_structured.determinize__x": {"tests": 3, "killed_by": "test_a"}}
    passed = {"ch16_structured.determinize__x": {"tests": 1, "killed_by": None}}
    for reports in ([killed, passed], [passed, killed]):
        assert merge_mutant_reports(reports) == {
            "ch16_structured.determinize__x": {"tests": 4, "killed_by": "test_a"}}
