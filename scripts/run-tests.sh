#!/usr/bin/env bash
# Run every test suite once and keep a JUnit report for the summary; the ten slowest tests are printed at the end,
# so a test that grows expensive shows up in every run. Usage: run-tests.sh PYTHON [PYTEST ARGS...]
#
# Without test paths in the arguments, the suites run as the shards of scripts/test-shards.txt side by side, each
# its own pytest process: "docker" (every test that starts Docker sandboxes), "ray" (the training runs on a local
# Ray cluster) and "rest". Much of a run waits on Docker, pip and Ray start-up (two shards kept 2 cores ≈45 % busy),
# so the shards overlap one's waiting with another's computing. Every Docker-sandbox test is in the docker shard: a
# run's start-up reaper removes sandboxes whose owner holds no lease, which some of those tests make on purpose.
# Each shard writes .cache/pytest-SHARD.log (printed when all are done) and .cache/junit-SHARD.xml; the reports are
# merged into .cache/junit.xml. integration_tests/test_ci_shards.py checks that the shards cover every test file
# exactly once. SKYRL_TEST_SHARDS=1 runs everything in one pytest process instead; with test paths (e.g.
# run-tests.sh python skyrl-gym/tests), one pytest runs them as given.
# pytest's exit code 5 ("no tests collected") is reported as what it is and counts as a failure: a suite that
# collects nothing has stopped testing anything (with shards: when no shard ran a test, since a -k or -m filter
# may leave one shard with nothing to run).
set -uo pipefail
python=$1
shift
mkdir -p .cache
shards_file=scripts/test-shards.txt
shard_count=${SKYRL_TEST_SHARDS:-3}

explain_rc() {  # $1: what ran, $2: pytest exit code
    if [ "$2" -eq 5 ]; then
        echo "run-tests: pytest collected no tests in $1 (exit 5); check the test paths and markers" >&2
    fi
}

has_paths=0
for arg in "$@"; do
    case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_paths=1 ;; esac
done
if [ "$has_paths" -eq 1 ] || [ "$shard_count" = 1 ]; then
    "$python" -m pytest --junitxml=.cache/junit.xml --durations=10 "$@"
    rc=$?
    explain_rc "the run" "$rc"
    exit "$rc"
fi

names=()              # shard names, in the file's order
declare -A paths=()   # shard name -> its paths, space-separated
while read -r name path _; do
    case "$name" in "" | "#"*) continue ;; esac
    [ -n "${paths[$name]+set}" ] || names+=("$name")
    paths[$name]+=" $path"
done <"$shards_file"
if [ "$shard_count" != "${#names[@]}" ]; then
    echo "run-tests: SKYRL_TEST_SHARDS=$shard_count, but $shards_file has ${#names[@]} shards; use 1 or ${#names[@]}" >&2
    exit 2
fi

shard_args() {  # $1: shard; prints its paths, then an --ignore for each path of another shard inside one of them
    local own other path dir
    read -ra own <<<"${paths[$1]}"
    printf '%s\n' "${own[@]}"
    for other in "${names[@]}"; do
        [ "$other" = "$1" ] && continue
        for path in ${paths[$other]}; do
            for dir in "${own[@]}"; do
                case "$path" in "$dir"/*) echo "--ignore=$path" ;; esac
            done
        done
    done
}

declare -A pids=() rcs=()
for name in "${names[@]}"; do
    mapfile -t args < <(shard_args "$name")
    rm -f ".cache/junit-$name.xml"  # a shard that stops before writing its report must not merge an old one
    "$python" -m pytest --junitxml=".cache/junit-$name.xml" --durations=10 "$@" "${args[@]}" \
        >".cache/pytest-$name.log" 2>&1 &
    pids[$name]=$!
done
echo "run-tests: ${#names[@]} shards side by side (${names[*]}; logs: .cache/pytest-SHARD.log)"
ran=0
for name in "${names[@]}"; do
    wait "${pids[$name]}"
    rcs[$name]=$?
    [ "${rcs[$name]}" -ne 5 ] && ran=1
done
for name in "${names[@]}"; do
    echo "================================ shard: $name ================================"
    cat ".cache/pytest-$name.log"
done
reports=() summary=()
for name in "${names[@]}"; do
    # A filter (-k, -m) may leave one shard with nothing to run; only a run in which no shard ran a test is exit 5.
    [ "$ran" -eq 1 ] && [ "${rcs[$name]}" -eq 5 ] && rcs[$name]=0
    explain_rc "shard $name" "${rcs[$name]}"
    reports+=(".cache/junit-$name.xml")
    summary+=("$name=${rcs[$name]}")
done
"$python" scripts/merge-junit.py .cache/junit.xml "${reports[@]}"
merge_rc=$?
echo "run-tests: shard exit codes: ${summary[*]}"
for name in "${names[@]}"; do
    [ "${rcs[$name]}" -ne 0 ] && exit "${rcs[$name]}"
done
exit "$merge_rc"
