"""Writes reference/cli.md into the docs at build time (mkdocs-gen-files), from `nvllm`'s own parsers."""

import mkdocs_gen_files

from frontend.cli.main import build_parser
from frontend.cli.reference import markdown

with mkdocs_gen_files.open("reference/cli.md", "w") as page:
    page.write(markdown(build_parser()))
