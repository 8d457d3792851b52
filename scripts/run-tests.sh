#!/usr/bin/env bash
# Run every test suite once and keep a JUnit report for the summary; the ten slowest tests are printed at the end,
# so a test that grows expensive shows up in every run. Usage: run-tests.sh PYTHON [PYTEST ARGS...]
#
# With SKYRL_TEST_SHARDS=2 and no test paths in the arguments, the suites run as two shards side by side, each its
# own pytest process (measured on 2 cores: 35-38 min of CI instead of ≈45, but a timing-sensitive fully_async test
# failed once in two sharded runs under the contention, so one process stays the default):
# "agent" (skyrl-gym, skyrl-agent, and every test that drives Docker sandboxes, which wait on the daemon more than
# they compute, plus a few long train tests that even out the two: measured, 26.9 and 33.3 min before they moved)
# and "train" (everything else). Every test that starts Docker sandboxes is in the agent shard: a
# run's start-up reaper removes sandboxes whose owner holds no lease, which some of those tests make on purpose.
# Each shard writes .cache/pytest-SHARD.log (printed when both are done) and .cache/junit-SHARD.xml; the reports
# are merged into .cache/junit.xml. integration_tests/test_ci_shards.py checks that the shards cover every test
# file exactly once. With test paths (e.g. run-tests.sh python skyrl-gym/tests), one pytest runs them as given.
# pytest's exit code 5 ("no tests collected") is reported as what it is and counts as a failure: a suite that
# collects nothing has stopped testing anything (with shards: when neither shard ran a test).
set -uo pipefail
python=$1
shift
mkdir -p .cache

AGENT_SHARD=(
    skyrl-gym/tests
    skyrl-agent/tests
    skyrl-train/tests/test_examples.py
    skyrl-train/tests/test_benchmarks_smoke.py
    integration_tests/test_package_isolation.py
    integration_tests/test_agent_bench_smoke.py
    integration_tests/test_command_harness_docker.py
    integration_tests/test_harness_cli.py
    integration_tests/test_swe_train_cli.py
)
TRAIN_SHARD=(skyrl-train/tests integration_tests)

explain_rc() {  # $1: shard name, $2: pytest exit code
    if [ "$2" -eq 5 ]; then
        echo "run-tests: pytest collected no tests in $1 (exit 5); check the test paths and markers" >&2
    fi
}

has_paths=0
for arg in "$@"; do
    case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_paths=1 ;; esac
done
if [ "$has_paths" -eq 1 ] || [ "${SKYRL_TEST_SHARDS:-1}" != 2 ]; then
    "$python" -m pytest --junitxml=.cache/junit.xml --durations=10 "$@"
    rc=$?
    explain_rc "the run" "$rc"
    exit "$rc"
fi

ignored=()
for path in "${AGENT_SHARD[@]}"; do
    case "$path" in skyrl-gym/* | skyrl-agent/*) ;; *) ignored+=("--ignore=$path") ;; esac
done
"$python" -m pytest --junitxml=.cache/junit-agent.xml --durations=10 "$@" "${AGENT_SHARD[@]}" \
    >.cache/pytest-agent.log 2>&1 &
agent=$!
"$python" -m pytest --junitxml=.cache/junit-train.xml --durations=10 "$@" "${TRAIN_SHARD[@]}" "${ignored[@]}" \
    >.cache/pytest-train.log 2>&1 &
train=$!
echo "run-tests: two shards side by side (logs: .cache/pytest-agent.log, .cache/pytest-train.log)"
wait "$agent"
agent_rc=$?
wait "$train"
train_rc=$?
for shard in agent train; do
    echo "================================ shard: $shard ================================"
    cat ".cache/pytest-$shard.log"
done
# A filter (-k, -m) may leave one shard with nothing to run; only a run in which no shard ran a test is exit 5.
if [ "$agent_rc" -eq 5 ] && [ "$train_rc" -ne 5 ]; then agent_rc=0; fi
if [ "$train_rc" -eq 5 ] && [ "$agent_rc" -ne 5 ]; then train_rc=0; fi
explain_rc agent "$agent_rc"
explain_rc train "$train_rc"
"$python" scripts/merge-junit.py .cache/junit.xml .cache/junit-agent.xml .cache/junit-train.xml
merge_rc=$?
echo "run-tests: agent shard exit $agent_rc, train shard exit $train_rc"
[ "$agent_rc" -ne 0 ] && exit "$agent_rc"
[ "$train_rc" -ne 0 ] && exit "$train_rc"
exit "$merge_rc"
