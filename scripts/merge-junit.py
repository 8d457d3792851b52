"""Merge pytest JUnit reports into one, and print the ten slowest tests across them.

Usage: merge-junit.py OUT IN [IN ...]. A missing or unreadable input is reported and makes the exit status 1 (the
shard that should have written it stopped early); the others are still merged.
"""

import sys
import xml.etree.ElementTree as ET


def main(out: str, inputs: list[str]) -> int:
    """Write the ``testsuite`` elements of ``inputs`` under one ``testsuites`` root at ``out``."""
    root, status = ET.Element("testsuites"), 0
    for path in inputs:
        try:
            report = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            print(f"merge-junit: {path} could not be read ({exc}); its shard stopped early", file=sys.stderr)
            status = 1
            continue
        root.extend([report] if report.tag == "testsuite" else list(report.iter("testsuite")))
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    slowest = sorted(root.iter("testcase"), key=lambda case: float(case.get("time", 0.0)), reverse=True)[:10]
    print("ten slowest tests across the shards:")
    for case in slowest:
        print(f"  {float(case.get('time', 0.0)):7.1f} s  {case.get('classname')}::{case.get('name')}")
    return status


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: merge-junit.py OUT IN [IN ...]")
    sys.exit(main(sys.argv[1], sys.argv[2:]))
