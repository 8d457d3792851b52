#!/usr/bin/env bash
# Run every test suite once and keep a JUnit report for the summary; the ten slowest tests are printed at the end,
# so a test that grows expensive shows up in every run. Usage: run-tests.sh PYTHON [PYTEST ARGS...]
# pytest's exit code 5 ("no tests collected") is reported as what it is and counts as a failure: a suite that
# collects nothing has stopped testing anything.
set -uo pipefail
python=$1
shift
mkdir -p .cache
"$python" -m pytest --junitxml=.cache/junit.xml --durations=10 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "run-tests: pytest collected no tests (exit 5); check the test paths and markers" >&2
fi
exit "$rc"
