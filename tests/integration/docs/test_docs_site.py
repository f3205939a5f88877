"""The documentation site: `mkdocs build --strict` passes (no broken link, anchor, reference or page left out of
the navigation), the API reference is generated from the docstrings, the CLI reference from the parsers (that
it names every command and flag: tests/unit/docs/test_cli_reference.py)."""

import os
import subprocess
import sys

import pytest

from tests.support.doc_pages import ROOT
from frontend.offline.llm import LLM

# MkDocs' plugins print a notice about a future MkDocs 2 on every build; it is not the build's output
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env=os.environ | QUIET)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def test_the_site_builds_strict_with_the_generated_references(site):
    api = (site / "reference" / "python-api" / "index.html").read_text()
    first_line = LLM.generate.__doc__.strip().splitlines()[0]
    assert first_line in api and "SamplingParams" in api and "EngineArgs" in api
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "nvllm serve" in cli and "--max-model-len" in cli
    assert (site / "performance" / "plots" / "vs-vllm.svg").exists()
