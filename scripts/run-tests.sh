#!/usr/bin/env bash
# Run every test suite once and keep a JUnit report for the summary. Usage: run-tests.sh PYTHON [PYTEST ARGS...]
# pytest's exit code 5 ("no tests collected") is reported as what it is and counts as a failure: a suite that
# collects nothing has stopped testing anything.
set -uo pipefail
python=$1
shift
mkdir -p .cache
"$python" -m pytest --junitxml=.cache/junit.xml "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "run-tests: pytest collected no tests (exit 5); check the test paths and markers" >&2
fi
exit "$rc"
