"""The soft assertions of the Python test scripts run by ctest: every failed check is printed
and counted, the script goes on, and finish() exits non-zero if any failed."""
import sys

failures = []


def check(cond, what):
    """Records `what` as a failure unless `cond`; returns `cond`."""
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def finish(name):
    """Exits 1 after a count of the failures, or prints that `name` passed."""
    if failures:
        print(f"{len(failures)} failure(s)", file=sys.stderr)
        sys.exit(1)
    print(f"{name}: all checks passed")
