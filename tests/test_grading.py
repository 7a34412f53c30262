"""The grading machinery itself: stub generation, the grader's table, hostile student code."""

from __future__ import annotations

import textwrap

import pytest

from minillm.grading.exercises import make_exercise
from minillm.grading.grade import run_graded_tests, score_table

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
