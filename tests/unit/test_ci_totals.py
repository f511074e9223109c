"""scripts/ci_totals.py: CI's totals from junit XML, each distinct test once per step."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.scripts import load_script


def _module() -> ModuleType:
    return load_script("ci_totals")


XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.a" name="test_ok"/>
  <testcase classname="tests.a" name="test_ok"/>
  <testcase classname="tests.a" name="test_bad"><failure message="x"/></testcase>
  <testcase classname="tests.a" name="test_bad"><error message="teardown"/></testcase>
  <testcase classname="tests.a" name="test_torn"/>
  <testcase classname="tests.a" name="test_torn"><error message="teardown"/></testcase>
  <testcase classname="tests.b" name="test_ok"/>
  <testcase classname="tests.b" name="test_skip"><skipped message="no gpu"/></testcase>
</testsuite></testsuites>
"""


def test_each_test_counts_once_with_its_worst_outcome(tmp_path: Path) -> None:
    ci = _module()
    path = tmp_path / "step.xml"
    path.write_text(XML)
    assert ci.totals([path]) == (2, 2, 1)  # passed, failed, skipped
    assert ci.totals([path, path]) == (4, 4, 2)  # two steps count separately


def test_a_missing_or_broken_file_counts_nothing(tmp_path: Path) -> None:
    ci = _module()
    broken = tmp_path / "broken.xml"
    broken.write_text("<testsuites><testcase")
    assert ci.totals([tmp_path / "missing.xml", broken]) == (0, 0, 0)
