"""A pytest plugin that records each graded test's exercise, points and outcome as JSON.

Loaded by ``minillm grade`` with ``-p minillm.grading.plugin --grade-report=FILE``.
Graded tests carry ``@pytest.mark.exercise("03.1", points=2)`` (shared equally by a
parametrized test's cases); the marker travels with
each test report as a user property, so this also works across pytest-xdist workers.
"""

from __future__ import annotations

import json

_results: dict[str, dict] = {}


def pytest_addoption(parser):
    parser.addoption("--grade-report", default=None, help="write per-test results here (JSON)")


def pytest_collection_modifyitems(items):
    """A test function's points are shared by its parametrized cases."""
    cases: dict[tuple, int] = {}
    for item in items:
        key = (item.path, getattr(item, "originalname", item.name))
        cases[key] = cases.get(key, 0) + 1
    for item in items:
        marker = item.get_closest_marker("exercise")
        if marker is not None:
            share = cases[(item.path, getattr(item, "originalname", item.name))]
            points = marker.kwargs.get("points", 1) / share
            item.user_properties.append(("exercise", (marker.args[0], points)))


def _first_line_of_failure(report) -> str:
    """The error message: pytest's crash line, or the ``E   ...Error`` line of a traceback."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        lines = [line.strip() for line in crash.message.splitlines() if line.strip()]
        return lines[0][:160] if lines else "failed"
    errors = [line[1:].strip() for line in str(report.longrepr).splitlines()
              if line.startswith("E ")]
    named = [line for line in errors if "Error" in line or "Exception" in line]
    return (named or errors or ["failed"])[-1][:160]


def pytest_runtest_logreport(report):
    exercise = dict(report.user_properties).get("exercise")
    if exercise is None:
        return
    result = _results.setdefault(report.nodeid, {
        "exercise": exercise[0], "points": exercise[1],
        "test": report.nodeid.split("::")[-1], "outcome": "passed", "reason": ""})
    if report.failed and result["outcome"] == "passed":
        result["outcome"] = "failed"
        result["reason"] = _first_line_of_failure(report)


def pytest_collectreport(report):
    """A test file that cannot even be imported (e.g. a syntax error in your exercise)."""
    if report.failed:
        _results[report.nodeid] = {
            "exercise": report.nodeid.split("/")[-1], "points": 0, "test": "(import)",
            "outcome": "failed", "reason": _first_line_of_failure(report)}


def pytest_sessionfinish(session):
    path = session.config.getoption("grade_report")
    if path:
        with open(path, "w") as f:
            json.dump(list(_results.values()), f, indent=1)
