"""A pytest plugin that runs every mutant against the graded tests of its exercise.

Loaded by ``minillm grade --check-mutants`` with ``-p minillm.grading.mutant_plugin
--mutant-report=FILE`` on graded test files, with ``MINILLM_IMPL=solutions``. Each graded
test is parametrized with the mutants of its exercise, and each mutant replaces one
function of the solutions module while its test runs, so one pytest process tries all
the mutants of several chapters. A mutant that fails a test is *killed* and its remaining
tests are skipped. The report lists, per mutant ("module.name"), the number of tests it
ran and the first failure (null if it survived).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import load_impl
from .mutants import MUTANTS_DIR, find_mutants, graded_module, mutant_function

_results: dict[str, dict] = {}  # "module.name" -> {"tests": n, "killed_by": str | None}


def pytest_addoption(parser):
    parser.addoption("--mutant-report", default=None, help="write per-mutant results (JSON)")
    parser.addoption("--mutants-dir", default=str(MUTANTS_DIR), help="where the mutants live")


def pytest_generate_tests(metafunc):
    """Give each graded test one run per mutant of its exercise."""
    marker = metafunc.definition.get_closest_marker("exercise")
    if marker is None:
        return
    module = graded_module(metafunc.module.__file__)  # -> ch09_sparsity
    mutants = [m for m in find_mutants(module, Path(metafunc.config.getoption("mutants_dir")))
               if m.exercise == marker.args[0]]
    if mutants:
        metafunc.fixturenames.append("mutant")  # a parameter the test function does not take
        metafunc.parametrize("mutant", mutants, ids=[m.name for m in mutants])


def _mutant(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("mutant") if callspec else None


def _key(mutant) -> str:
    return f"{mutant.module}.{mutant.name}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The mutant replaces its solution function while its test runs (setup to teardown)."""
    mutant = _mutant(item)
    if mutant is None:
        return (yield)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(load_impl(mutant.module, "solutions"), mutant.function,
                      mutant_function(mutant))
        return (yield)


def pytest_collection_modifyitems(config, items):
    """Only the runs of a mutant are kept: a test without one would just test the solutions."""
    config.hook.pytest_deselected(items=[item for item in items if not _mutant(item)])
    items[:] = [item for item in items if _mutant(item)]
    for item in items:
        item.user_properties.append(("mutant", _key(_mutant(item))))
        _results.setdefault(_key(_mutant(item)), {"tests": 0, "killed_by": None})


def pytest_runtest_setup(item):
    if _results[_key(_mutant(item))]["killed_by"]:
        pytest.skip("this mutant is already killed")


def pytest_runtest_logreport(report):
    key = dict(report.user_properties).get("mutant")
    if key is None or report.skipped:
        return
    result = _results[key]
    result["tests"] += report.when == "call"
    if report.failed and not result["killed_by"]:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = crash.message.splitlines()[0] if crash and crash.message else "failed"
        result["killed_by"] = f"{report.nodeid.split('::')[-1]}: {reason[:120]}"


def pytest_sessionfinish(session):
    path = session.config.getoption("mutant_report")
    if path:
        Path(path).write_text(json.dumps(_results, indent=1))
