"""The performance figures users read are the result files' figures.

The performance pages (docs/performance/*.md and their plots) are rendered from benchmarks/results/ by
`nvllm bench report`; a committed page that differs from what the result files render now fails here.
Outside the generated pages, a figure (a number with a rate, time, ratio or percent unit) may appear in
prose only as a quote of one table row, followed by a link to that row (`performance/PAGE.md#ROW`), and the
row must hold the figure: a figure typed by hand, or left behind when its row changed, fails here.
"""

import glob
import os
import re

import pytest

from tests.support.doc_pages import DOCS, ROOT
from benchmarks import report
from benchmarks.report.pages import GENERATED
from benchmarks.report.results import load
from benchmarks.result_file import machine_label

pytestmark = pytest.mark.unit

NUMBER = r"\d+(?:\.\d+)?"
UNIT = (r"(?:x(?![\w])|\s*(?:(?:output|prompt|total)\s+)?(?:tok/s|tokens/s|req/s|requests/s)"
        r"|\s*(?:ms|GFLOP/s|GB/s|MB)(?![\w/])|\s*%)")
# "1.40x", "356 output tok/s", "5.88-6.03 ms", "44%"; a range's both ends are figures
FIGURE = re.compile(rf"(?<![\w.\-/]){NUMBER}(?:\s*[-–]\s*{NUMBER})?{UNIT}")
ROW_LINK = re.compile(r"\]\(([\w./-]+\.md)#([\w-]+)\)")
ANCHOR = re.compile(r'<a id="([\w-]+)"></a>')


def strip_code(text: str) -> str:
    """Fenced blocks and inline code are commands and names, not figures."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", "", text)


def prose_pages() -> dict[str, str]:
    """README and every hand-written docs page (the generated ones say so on their first line)."""
    pages = {"README.md": open(os.path.join(ROOT, "README.md")).read()}
    for path in sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)):
        text = open(path).read()
        if not text.startswith(GENERATED):
            pages[os.path.relpath(path, ROOT)] = text
    return pages


def rows(page: str) -> dict[str, str]:
    """{anchor: the row's text} of one generated performance page (a path under docs/performance/)."""
    path = os.path.join(DOCS, "performance", page)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {m.group(1): line for line in f for m in ANCHOR.finditer(line)}


def quotes(text: str) -> list[tuple[str, str | None, str | None]]:
    """(figure, page, row) for each figure in the prose: the first row link after it in the same paragraph."""
    found = []
    for paragraph in re.split(r"\n\s*\n", strip_code(text)):
        for match in FIGURE.finditer(paragraph):
            link = ROW_LINK.search(paragraph, match.end())
            found.append((match.group(), link.group(1) if link else None, link.group(2) if link else None))
    return found


def normal(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_generated_pages_and_plots_are_current():
    assert not report.stale(), "run `nvllm bench report` and commit docs/performance/"


def test_every_result_file_says_where_it_came_from_and_sits_by_machine_and_topic():
    results = load()
    assert results, "benchmarks/results/ holds no result file"
    for result in results:
        data = result.data
        assert data["command"].startswith("nvllm bench "), result.path
        assert re.fullmatch(r"[0-9a-f]{7,40}", data["commit"]), f"{result.path}: measured on an uncommitted tree"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["date"]), result.path
        cpu = data["cpu"]
        assert data["machine"] == machine_label(cpu["model"], cpu["flags"], cpu.get("forced_tier")), result.path
    assert not report.pages.check_layout(results)


def unquoted(pages: dict[str, str]) -> list[str]:
    """The figures of these pages that do not quote the row they link (links relative to the page)."""
    found = []
    for name, text in pages.items():
        for figure, link, anchor in quotes(text):
            target = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), link or ""))
            page = os.path.relpath(target, os.path.join(DOCS, "performance")) if link else None
            if page is None:
                found.append(f"{name}: {figure} (no link to a performance row after it)")
                continue
            row = rows(page).get(anchor)
            if row is None:
                found.append(f"{name}: {figure} links {page}#{anchor}, which is no row")
            elif normal(figure) not in normal(re.sub(r"<[^>]+>", "", row)):
                found.append(f"{name}: {figure} is not in the row it links ({page}#{anchor})")
    return found


def test_every_figure_in_prose_quotes_the_row_it_links():
    found = unquoted(prose_pages())
    assert not found, "figures in prose without their row:\n" + "\n".join(found)


def test_docs_words_for_history_do_not_appear():
    """The docs say what is true now; what changed when is the git log's."""
    history = re.compile(r"this session|the issue|issue \d+|minutes before|superseded", re.I)
    found = [f"{name}: {m.group()}" for name, text in prose_pages().items() for m in history.finditer(text)]
    assert not found, found


@pytest.mark.parametrize("text, expected", [
    ("decode at 0.98x vLLM ([row](performance/vs-vllm.md#a-b)), 356 output tok/s, 5.88-6.03 ms, lost 44%",
     [("0.98x", "performance/vs-vllm.md", "a-b"), ("356 output tok/s", None, None), ("5.88-6.03 ms", None, None),
      ("44%", None, None)]),
    ("`--max-num-batched-tokens 512` and 2 x intermediate, the bf16 kernels, W32, x86-64, 1/2 ms", []),
    ("```bash\nnvllm bench cpu   # 1.40x\n```\nnothing", []),
])
def test_quotes_are_found(text, expected):
    assert quotes(text) == expected


def test_a_figure_is_held_to_the_row_it_links():
    anchor, row = next(iter(rows("vs-vllm.md").items()))
    ratio = re.search(r"\d+\.\d\dx", row).group()
    wrong = f"{float(ratio[:-1]) + 0.01:.2f}x"
    link = f"([the row](docs/performance/vs-vllm.md#{anchor}))"
    assert unquoted({"right.md": f"nvllm at {ratio} {link}"}) == []
    assert len(unquoted({"wrong.md": f"nvllm at {wrong} {link}"})) == 1
    assert len(unquoted({"nowhere.md": f"nvllm at {ratio} ([row](docs/performance/vs-vllm.md#no-such-row))"})) == 1
    assert len(unquoted({"docs/serving/x.md": f"nvllm at {ratio} ([row](../performance/vs-vllm.md#{anchor}))"})) == 0


def test_bench_report_writes_the_pages_and_check_finds_them_stale_or_current(tmp_path, capsys):
    from frontend.cli.main import main

    out = str(tmp_path / "performance")
    assert main(["bench", "report", "--out", out, "--check"]) == 1  # nothing written yet: every page is stale
    assert "is stale" in capsys.readouterr().err
    assert main(["bench", "report", "--out", out]) == 0
    assert os.path.exists(os.path.join(out, "vs-vllm.md")) and os.path.exists(os.path.join(out, "plots", "vs-vllm.svg"))
    assert main(["bench", "report", "--out", out, "--check"]) == 0
    with open(os.path.join(out, "costs.md"), "a") as f:
        f.write("a typed figure: 9.99x\n")
    assert main(["bench", "report", "--out", out, "--check"]) == 1
