"""Where things are, for tests at any depth below tests/: the repository root and the tests' data folder."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
