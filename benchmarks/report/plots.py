"""The performance pages' plots (SVG), drawn from the same result files as the tables.

The SVG is written reproducibly (no date, fixed ids, text kept as text) so a test can regenerate it and
compare bytes; matplotlib's version is pinned in the docs extra for the same reason."""

import io

from benchmarks.report.results import Result, model_name


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("the plots are drawn with matplotlib, which the docs extra installs: "
                         "pip install -e '.[docs]'") from None

    matplotlib.use("svg")
    matplotlib.rcParams.update({"svg.hashsalt": "nvllm", "svg.fonttype": "none", "font.size": 9})
    import matplotlib.pyplot as plt

    return plt


def _svg(figure) -> str:
    out = io.StringIO()
    figure.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    _pyplot().close(figure)
    return out.getvalue()


def _short(result: Result) -> str:
    return f"{result.machine}\n{model_name(result)}"


def ratio_bars(pairs: list[tuple[str, float]], title: str, xlabel: str) -> str:
    """Horizontal bars of ratios with the line at 1.0 (even): longer than the line is faster than the other."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 0.45 * len(pairs) + 1.2))
    labels = [label for label, _ in pairs]
    values = [value for _, value in pairs]
    colours = ["#2a7ab9" if value >= 1 else "#c0504d" for value in values]
    axes.barh(range(len(pairs)), values, color=colours)
    axes.set_yticks(range(len(pairs)), labels)
    axes.invert_yaxis()
    axes.axvline(1.0, color="black", linewidth=0.8)
    for i, value in enumerate(values):
        axes.text(value, i, f" {value:.2f}x", va="center")
    axes.set_xlabel(xlabel)
    axes.set_title(title)
    axes.set_xlim(0, max(values) * 1.2)
    return _svg(figure)


def vs_vllm(results: list[Result]) -> str:
    pairs = [(f"{_short(r)} · {item['workload']}", item["ratio"])
             for r in results if r.topic == "vs-vllm" for item in r.results["summary"]]
    return ratio_bars(pairs, "nvllm against vLLM CPU, same machine and weights", "nvllm / vLLM (higher is faster)")


def vs_llama_cpp(results: list[Result]) -> str:
    pairs = []
    for r in results:
        if r.topic == "vs-llama-cpp" and r.bench == "llama-cpp":
            pairs.append((f"{_short(r)} · prefill", r.results["prefill_nvllm_over_llama_cpp"]))
            pairs.append((f"{_short(r)} · decode", r.results["decode_nvllm_over_llama_cpp"]))
    return ratio_bars(pairs, "nvllm against llama.cpp, same GGUF file and threads",
                      "nvllm / llama.cpp (higher is faster)")


def decode_against_bound(results: list[Result]) -> str:
    """Time per output token against the time to stream the weights once from memory, by model size."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.2))
    runs = [r for r in results if r.bench == "latency" and r.results.get("weight_stream")
            and not r.results.get("speculative")]
    machines = sorted({r.machine for r in runs})
    for i, machine in enumerate(machines):
        mine = [r for r in runs if r.machine == machine]
        sizes = [r.results["weight_stream"]["streamed_mb"] for r in mine]
        colour = f"C{i}"
        axes.scatter(sizes, [r.results["ms_per_output_token"] for r in mine], color=colour, marker="o",
                     label=f"{machine}: time per token")
        axes.scatter(sizes, [r.results["weight_stream"]["bound_ms"] for r in mine], color=colour, marker="_",
                     s=200, label=f"{machine}: weight-streaming bound")
    axes.set_xscale("log")
    axes.set_yscale("log")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for axis in (axes.xaxis, axes.yaxis):  # 50, not 5x10^1
        axis.set_major_locator(FixedLocator([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("weights read per token (MB)")
    axes.set_ylabel("ms per output token, one request")
    axes.set_title("Decode against the memory bound")
    axes.legend(fontsize=7)
    return _svg(figure)


def prefill_against_peak(results: list[Result]) -> str:
    pairs = [(_short(r), item["nvllm_fraction_of_peak"])
             for r in results if r.topic == "vs-vllm" for item in r.results["summary"]
             if "nvllm_fraction_of_peak" in item]
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 0.5 * len(pairs) + 1.2))
    axes.barh(range(len(pairs)), [value * 100 for _, value in pairs], color="#2a7ab9")
    axes.set_yticks(range(len(pairs)), [label for label, _ in pairs])
    axes.invert_yaxis()
    for i, (_, value) in enumerate(pairs):
        axes.text(value * 100, i, f" {value * 100:.0f}%", va="center")
    axes.set_xlim(0, 100)
    axes.set_xlabel("prefill FLOP rate, % of the machine's GEMM peak (oneDNN or nvllm's best, same shapes)")
    axes.set_title("Prefill against the GEMM peak")
    return _svg(figure)


PLOTS = {"vs-vllm.svg": vs_vllm, "vs-llama-cpp.svg": vs_llama_cpp, "decode-vs-bound.svg": decode_against_bound,
         "prefill-vs-peak.svg": prefill_against_peak}
