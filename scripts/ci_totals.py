"""Count a test step's results from pytest's junit XML, each distinct test once.

    python scripts/ci_totals.py STEP.xml [STEP.xml ...]

prints ``passed failed skipped`` summed over the files. Within one file a test id
(classname::name) counts once with its worst outcome (failed > skipped > passed): a test that
fails in its call and errors in its teardown is one failed test, and an MPI step (whose rank 0
writes the agreed verdicts, tests/conftest.py) counts each test once, not once per rank.
A missing or unreadable file counts nothing (the step's exit code decides it failed).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

_WORST = {"passed": 0, "skipped": 1, "failed": 2}


def cases(path: Path) -> dict[str, tuple[str, float]]:
    """``{test id: (outcome, seconds)}`` of one junit XML file: a test's worst outcome over
    its records, and the seconds they add up to."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    seen: dict[str, tuple[str, float]] = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        try:
            seconds = float(case.get("time", "0") or 0)
        except ValueError:
            seconds = 0.0
        before, spent = seen.get(test_id, ("passed", 0.0))
        worst = outcome if _WORST[outcome] >= _WORST[before] else before
        seen[test_id] = (worst, spent + seconds)
    return seen


def outcomes(path: Path) -> dict[str, str]:
    """``{test id: outcome}`` of one junit XML file."""
    return {test_id: outcome for test_id, (outcome, _) in cases(path).items()}


def totals(paths: list[Path]) -> tuple[int, int, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for path in paths:
        for outcome in outcomes(path).values():
            counts[outcome] += 1
    return counts["passed"], counts["failed"], counts["skipped"]


def main(argv: list[str]) -> int:
    passed, failed, skipped = totals([Path(a) for a in argv])
    print(passed, failed, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
