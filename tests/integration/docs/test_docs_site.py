"""The documentation site: `mkdocs build --strict` passes (no broken link, anchor, reference or page left out of
the navigation), the API reference is generated from the docstrings, the CLI reference from the parsers."""

import os
import re
import subprocess
import sys

import pytest

from tests.support.doc_pages import ROOT
from frontend.cli.main import build_parser
from frontend.cli.reference import markdown, subcommands
from frontend.llm import LLM

# MkDocs' plugins print a notice about a future MkDocs 2 on every build; it is not the build's output
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env=os.environ | QUIET)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.mark.integration
def test_the_site_builds_strict_with_the_generated_references(site):
    api = (site / "reference" / "python-api" / "index.html").read_text()
    first_line = LLM.generate.__doc__.strip().splitlines()[0]
    assert first_line in api and "SamplingParams" in api and "EngineArgs" in api
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "nvllm serve" in cli and "--max-model-len" in cli
    assert (site / "performance" / "plots" / "vs-vllm.svg").exists()


@pytest.mark.unit
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
