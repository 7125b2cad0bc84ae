"""The tiers guard (tests/tiers.py): a unit test that starts a child process fails with a message
naming the fix, whatever the code under test did with the refusal; a ``cpu`` test is left alone;
``-m unit`` selects exactly the unmarked tests. Runs an inner pytest session in this process."""

from __future__ import annotations

import pytest

INNER_CONFTEST = """
import pytest
from tiers import mark_tiers, pytest_runtest_makereport, pytest_runtest_protocol

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    mark_tiers(items)

def pytest_configure(config):
    config.addinivalue_line("markers", "cpu: starts processes")
"""

INNER_TESTS = """
import os, subprocess, sys
import pytest

def test_starts_python():
    subprocess.run([sys.executable, "-c", "pass"])

def test_swallows_the_refusal():
    try:
        os.fork()
    except Exception:
        pass

def test_system_probe_is_not_a_child_of_the_test():
    subprocess.run(["uname", "-p"], capture_output=True)

def test_in_process():
    assert sum(range(4)) == 6

@pytest.mark.cpu
def test_marked_cpu():
    assert True
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # installed plugins may start processes of their own
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester


def test_unit_tests_that_start_processes_fail_and_say_how_to_mark_them(inner):
    result = inner.runpytest_inprocess("-m", "unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2, deselected=1)
    failed = {r.nodeid: str(r.longrepr) for r in result.reprec.getreports("pytest_runtest_logreport") if r.failed}
    assert sorted(n.split("::")[1] for n in failed) == ["test_starts_python", "test_swallows_the_refusal"]
    assert all("started a child process" in text and "@pytest.mark.cpu" in text for text in failed.values())


def test_the_cpu_tier_runs_alone(inner):
    inner.runpytest_inprocess("-m", "cpu", "-p", "no:cacheprovider").assert_outcomes(passed=1, deselected=4)
