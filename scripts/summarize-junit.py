"""Print a short summary of a pytest JUnit report: totals, then every failure, error and skip with its reason."""

import sys
import xml.etree.ElementTree as ET


def main(path: str) -> int:
    """Print the summary of the report at ``path``."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    seconds = 0.0
    for suite in suites:
        for key in totals:
            totals[key] += int(suite.get(key, 0))
        seconds += float(suite.get("time", 0.0))
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    print(
        f"tests: {totals['tests']}  passed: {passed}  failed: {totals['failures']}  "
        f"errors: {totals['errors']}  skipped: {totals['skipped']}  ({seconds:.0f} s)"
    )
    for case in root.iter("testcase"):
        for outcome in ("failure", "error", "skipped"):
            node = case.find(outcome)
            if node is not None:
                reason = (node.get("message") or "").splitlines()[0:1]
                name = f"{case.get('classname')}::{case.get('name')}"
                print(f"  {outcome.upper():8} {name}: {reason[0] if reason else ''}"[:220])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
