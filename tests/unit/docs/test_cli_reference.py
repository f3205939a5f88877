"""The CLI reference page generated from the parsers names every command and flag, each with what it does."""

import re

import pytest

from frontend.cli.main import build_parser
from frontend.cli.reference import markdown, subcommands

pytestmark = pytest.mark.unit


def test_the_cli_reference_has_every_command_and_flag_with_what_it_does():
    page = markdown(build_parser())
    commands = subcommands(build_parser())
    names = {name for name, _, _ in commands}
    assert {"serve", "engine-core", "frontend", "bench serve", "bench report", "keys generate"} <= names
    for name, parser, _ in commands:
        assert f"\n## nvllm {name}\n" in page, name
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            row = next((line for line in page.split(f"\n## nvllm {name}\n", 1)[1].split("\n## ", 1)[0].splitlines()
                        if line.startswith(f"| `{action.option_strings[0]}`")), None)
            assert row is not None, (name, action.option_strings[0])
            assert re.search(r"\|\s*[^|\s][^|]*\|\s*$", row), f"nvllm {name} {action.option_strings[0]}: no help text"
