#!/usr/bin/env bash
# Mutation testing of zerofit's pure-logic modules (docs/mutation-testing.md).
#   tools/mutation/run.sh                      every target of targets.toml, guards + fast tests
#   tools/mutation/run.sh config_limits        one target (or several)
#   tools/mutation/run.sh --before             the existing fast tests only (results/before/)
#   tools/mutation/run.sh --planted            the hand-planted bugs of planted.toml
#   tools/mutation/run.sh --list models_lora   list the mutants, run nothing
# Run from the repository root; the working tree is copied to a scratch directory first and
# never written to (results go to tools/mutation/results/). CPU heavy: one module at a time.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
exec nice -n 10 "$PY" tools/mutation/mutate.py "$@"
