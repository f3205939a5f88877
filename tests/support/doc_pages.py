"""Reading the user docs from tests: a page of docs/ (or README.md), one of its sections, its code blocks.

The examples the docs show are run by the tests from where the docs keep them, so an example that stops
working fails a test, and moving one keeps it tested only if the test follows it here.
"""

import os
import re

from tests.support.paths import ROOT

DOCS = os.path.join(ROOT, "docs")


def page(path: str) -> str:
    """The text of docs/PATH ('serving/index.md'), or of README.md when PATH is 'README.md'."""
    with open(os.path.join(ROOT if path == "README.md" else DOCS, path)) as f:
        return f.read()


def section(text: str, heading: str) -> str:
    """The body under the Markdown heading named `heading` (any level), up to the next heading of the same
    or a higher level; fenced code is skipped when looking for headings."""
    lines, body, level, fenced = text.splitlines(), None, 0, False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        found = None if fenced else re.match(r"(#+)\s+(.*?)\s*$", line)
        if body is None:
            if found and found.group(2) == heading:
                body, level = [], len(found.group(1))
            continue
        if found and len(found.group(1)) <= level:
            break
        body.append(line)
    if body is None:
        raise AssertionError(f"no heading {heading!r}")
    return "\n".join(body)


def code_blocks(text: str, lang: str) -> list[str]:
    """The fenced blocks of one language, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)
