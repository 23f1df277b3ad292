"""Where the tests find the repository: one place, so a test file can move between the
folders of tests/ without counting ``dirname`` calls."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
DATA = os.path.join(TESTS, "data")
EXAMPLES = os.path.join(REPO, "examples")
