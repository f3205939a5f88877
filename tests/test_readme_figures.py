"""README's performance figures are the result files' figures.

Every figure README states (a number with a rate, time, size, ratio or percent unit, and every number in a
table whose header names such a unit) must be held by a result file that its section names
(`benchmarks/results/NAME.json`, written by `nvllm bench ... --output-json`), and the machine a section
names must be the machine its results were measured on. A figure typed by hand, or left behind after the
results moved, fails here.
"""

import json
import os
import re

import pytest

from frontend.bench.result_file import machine_label

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
RESULT_REF = re.compile(r"benchmarks/results/[\w.-]+\.json")

NUMBER = r"\d+(?:\.\d+)?"
UNIT = (r"(?:x(?![\w])|\s*(?:(?:output|prompt|total|tiny)\s+)?(?:tok/s|tokens/s|req/s|requests/s)"
        r"|\s*(?:ms|GFLOP/s|GB/s|MB)(?![\w/])|\s*%)")
# "1.40x", "356 output tok/s", "5.88-6.03 ms", "-44%", "**1.02**"; a range's both ends are figures
FIGURE = re.compile(rf"(?<![\w.]){NUMBER}(?:\s*[-–]\s*{NUMBER})?{UNIT}|\*\*{NUMBER}\*\*")
TABLE_UNIT_HEADER = re.compile(r"tok/s|req/s|\bms\b|GFLOP/s|GB/s|ratio|\bx\b|%|[0-9]x\b")
CELL_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}%?(?![\w.])")
MACHINE = re.compile(r"(?:Intel Xeon|AMD EPYC)(?: with (?:AMX|AVX512-BF16|AVX512 \(no BF16\)|AVX2 only))?"
                     r"(?:, kernels forced to \w+)?")


def strip_code(text: str) -> str:
    """Fenced blocks and inline code are commands and names, not figures."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", "", text)


def sections(readme: str) -> list[tuple[str, str]]:
    """(heading, body) for each heading of README, fenced code kept (a `#` in a code block is no heading)."""
    found, heading, body, fenced = [], "(top)", [], False
    for line in readme.splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            found.append((heading, "\n".join(body)))
            heading, body = line.lstrip("#").strip(), []
        else:
            body.append(line)
    found.append((heading, "\n".join(body)))
    return found


def figures(body: str) -> list[str]:
    """The figures of one section, each as README writes it ("1.40", "44%")."""
    prose = strip_code(body)
    found = []
    for match in FIGURE.finditer(prose):
        percent = match.group().rstrip().endswith("%")
        found += [n + ("%" if percent else "") for n in re.findall(NUMBER, match.group())]
    header = None
    for line in prose.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(set(c) <= set("-: ") for c in cells) and TABLE_UNIT_HEADER.search(" ".join(header)):
            for cell in cells[1:]:  # the first column names the row
                found += CELL_NUMBER.findall(cell)
    return found


def numbers_in(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers_in(v)]
    return []


def held(figure: str, numbers: list[float]) -> bool:
    """A figure is held by a result number that rounds to it (a percent also as a fraction)."""
    text = figure.rstrip("%")
    places = len(text.partition(".")[2])
    value = float(text)
    candidates = [(value, places)] + ([(value / 100, places + 2)] if figure.endswith("%") else [])
    return any(abs(abs(n) - v) <= 0.5 * 10 ** -p + 1e-9 for v, p in candidates for n in numbers)


def load_results() -> dict[str, dict]:
    return {f"benchmarks/results/{name}": json.load(open(os.path.join(RESULTS, name)))
            for name in sorted(os.listdir(RESULTS)) if name.endswith(".json")}


def readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_every_result_file_says_where_it_came_from():
    results = load_results()
    assert results, "benchmarks/results/ holds no result file"
    for name, result in results.items():
        assert result["command"].startswith("nvllm bench "), name
        assert re.fullmatch(r"[0-9a-f]{7,40}", result["commit"]), f"{name}: measured on an uncommitted tree"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", result["date"]), name
        cpu = result["cpu"]
        assert result["machine"] == machine_label(cpu["model"], cpu["flags"], cpu.get("forced_tier")), name
        assert numbers_in(result["results"]), f"{name} holds no figure"


def test_every_readme_figure_is_in_a_result_file_its_section_names():
    results = load_results()
    missing = []
    for heading, body in sections(readme()):
        found = figures(body)
        refs = sorted(set(RESULT_REF.findall(body)))
        for ref in refs:
            assert ref in results, f"README section '{heading}' names {ref}, which is not committed"
        if found and not refs:
            missing.append(f"'{heading}': {', '.join(found[:8])} (the section names no result file)")
            continue
        numbers = [n for ref in refs for n in numbers_in(results[ref]["results"])]
        unheld = [f for f in found if not held(f, numbers)]
        if unheld:
            missing.append(f"'{heading}': {', '.join(unheld)} (not in {', '.join(refs)})")
    assert not missing, "README figures without a result behind them:\n" + "\n".join(missing)


def test_each_section_names_the_machine_its_results_ran_on():
    results = load_results()
    for heading, body in sections(readme()):
        refs = sorted(set(RESULT_REF.findall(body)))
        if not refs:
            continue
        machines = {results[ref]["machine"] for ref in refs}
        prose = " ".join(strip_code(body).split())  # a label may wrap across lines
        for machine in machines:
            assert machine in prose, f"README section '{heading}' does not say its figures ran on a {machine}"
        for named in MACHINE.findall(prose):
            assert any(m.startswith(named) for m in machines), \
                f"README section '{heading}' names a {named}, but its results ran on {', '.join(sorted(machines))}"


def test_every_result_file_is_quoted():
    quoted = set(RESULT_REF.findall(readme()))
    assert not set(load_results()) - quoted, "result files README does not name"


@pytest.mark.parametrize("text, expected", [
    ("W32 at **1.40x** vLLM, 356 output tok/s, 5.88-6.03 ms per token, lost 44%, **1.02**",
     ["1.40", "356", "5.88", "6.03", "44%", "1.02"]),
    ("`--max-num-batched-tokens 512` and 2 x intermediate, the bf16 kernels, W32", []),
    ("| workload | nvllm tok/s |\n|---|---|\n| `w32` 32 prompts | 356 (350, 362) |", ["356", "350", "362"]),
    ("| flag | default |\n|---|---|\n| `--port` | 8000 |", []),
])
def test_what_counts_as_a_figure(text, expected):
    assert figures(text) == expected


def test_a_figure_is_held_only_by_a_number_that_rounds_to_it():
    assert held("1.40", [1.403]) and held("44%", [0.441]) and held("356", [355.6])
    assert not held("1.40", [1.406]) and not held("356", [357.0]) and not held("44%", [0.46])


@pytest.mark.parametrize("model, flags, label", [
    ("Intel(R) Xeon(R) Processor", ["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "Intel Xeon with AMX"),
    ("AMD EPYC 9R14 96-Core Processor", ["avx2", "avx512f", "avx512_bf16"], "AMD EPYC with AVX512-BF16"),
    ("Intel(R) Xeon(R) Platinum 8259CL", ["avx2", "avx512f"], "Intel Xeon with AVX512 (no BF16)"),
    ("AMD EPYC 7B12", ["avx2", "fma", "f16c"], "AMD EPYC with AVX2 only"),
])
def test_machine_labels_name_the_best_kernel_tier(model, flags, label):
    assert machine_label(model, flags) == label
    assert machine_label(model, flags, "avx2") == label + ", kernels forced to avx2"


def test_cpu_info_reads_model_and_kernel_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("NVLLM_CPU_ISA", raising=False)
    from frontend.bench.result_file import cpu_info

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx2 fma f16c rdrand\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx2 fma f16c rdrand\n")
    info = cpu_info(str(cpuinfo))
    assert info["model"] == "AMD EPYC 7B12" and info["flags"] == ["avx2", "f16c", "fma"] and info["cpus"] >= 1
    assert info["forced_tier"] is None
