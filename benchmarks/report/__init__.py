"""`nvllm bench report`: the performance pages of the docs, rendered from the committed result files."""

import os
import sys

from common.child_process import ROOT
from benchmarks.report import pages, plots
from benchmarks.report.results import RESULTS_DIR, load

PAGES_DIR = os.path.join(ROOT, "docs", "performance")


def rendered(results_dir: str = RESULTS_DIR) -> dict[str, str]:
    """{path under docs/performance/: its text} for every generated page and plot."""
    results = load(results_dir)
    wrong = pages.check_layout(results)
    if wrong:
        raise ValueError("result files out of place:\n" + "\n".join(wrong))
    out = {spec.file: pages.render(spec, results) for spec in pages.PAGES}
    out.update({f"plots/{name}": draw(results) for name, draw in plots.PLOTS.items()})
    return out


def stale(out_dir: str = PAGES_DIR, results_dir: str = RESULTS_DIR) -> list[str]:
    """The generated files that differ from what the result files render now (or are missing)."""
    differ = []
    for name, text in rendered(results_dir).items():
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            differ.append(name)
            continue
        with open(path) as f:
            if f.read() != text:
                differ.append(name)
    return differ


def run(args) -> int:
    if args.check:
        differ = stale(args.out, args.results)
        for name in differ:
            print(f"{os.path.join(args.out, name)} is stale: run `nvllm bench report`", file=sys.stderr)
        return 1 if differ else 0
    for name, text in rendered(args.results).items():
        path = os.path.join(args.out, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path)}")
    return 0


def register(kinds, formatter) -> None:
    p = kinds.add_parser("report", help="render the docs' performance pages and plots from the result files",
                         formatter_class=formatter)
    p.add_argument("--results", default=RESULTS_DIR, help="result files, as MACHINE/TOPIC/NAME.json")
    p.add_argument("--out", default=PAGES_DIR, help="where the pages go (plots under plots/)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page or plot is stale")
    p.set_defaults(func=run)
