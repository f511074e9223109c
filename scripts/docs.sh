#!/usr/bin/env bash
# The API reference (docs/api): Sphinx's autodoc over the packages' numpydoc docstrings, every
# warning an error (-W --keep-going: all of them listed, then a failure), every cross-reference
# checked (-n). Called by `./dev docs` (into docs/_build/api) and by the suite's docs tier.
#   scripts/docs.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT="${1:?usage: scripts/docs.sh OUTDIR}"
# -E: every page read afresh (a cached page would not repeat its warnings); the doctrees beside
# the pages, not in them
exec "$PY" -m sphinx -E -W --keep-going -n -q -b html -d "$OUT.doctrees" docs/api "$OUT"
