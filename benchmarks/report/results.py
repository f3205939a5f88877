"""The committed result files, laid out as benchmarks/results/MACHINE/TOPIC/NAME.json.

MACHINE is a short slug of the file's own machine label (tests hold the two to agree), TOPIC the page that
shows the file: vs-vllm, vs-llama-cpp, latency, throughput, serve or costs."""

import dataclasses
import json
import os
import re

from common.child_process import ROOT

RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
TOPICS = ("vs-vllm", "vs-llama-cpp", "latency", "throughput", "serve", "costs")


@dataclasses.dataclass
class Result:
    path: str  # relative to the repository root
    machine_dir: str
    topic: str
    name: str
    data: dict

    @property
    def machine(self) -> str:
        """What the figures ran on: the GPU for GPU runs, else the CPU's label."""
        gpu = self.data.get("gpu")
        if gpu:
            return gpu["nvidia_smi"].split(",")[0]
        return self.data["machine"]

    @property
    def bench(self) -> str:
        """The bench that wrote it: 'cpu', 'latency', 'throughput', 'llama-cpp', ..."""
        return self.data["command"].split()[2]

    @property
    def results(self):
        return self.data["results"]

    @property
    def anchor(self) -> str:
        """The id of this file's rows on its page (a row of several adds its own suffix)."""
        return slug(f"{self.machine_dir}-{self.name}")

    def run_line(self) -> str:
        """Where the figures came from, for the table's notes."""
        cpu = self.data["cpu"]
        flags = " ".join(cpu["flags"])
        return (f"`{self.path}`: `{self.data['command']}` at commit `{self.data['commit']}`, "
                f"{self.data['date'][:10]}, {cpu['model']} ({cpu['cpus']} CPUs; {flags})")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_slug(label: str) -> str:
    """'Intel Xeon with AMX' -> 'intel-xeon-amx'; 'AMD EPYC with AVX2 only' -> 'amd-epyc-avx2';
    'Intel Xeon with AMX, kernels forced to avx2' -> 'intel-xeon-amx-forced-avx2'; 'NVIDIA H200' -> 'nvidia-h200'."""
    words = slug(label.replace(" with ", " ").replace(", kernels forced to ", " forced ").replace(" only", ""))
    return words.replace("avx512-bf16", "avx512bf16")


def load(results_dir: str = RESULTS_DIR) -> list[Result]:
    found = []
    for machine_dir in sorted(os.listdir(results_dir)):
        for topic in sorted(os.listdir(os.path.join(results_dir, machine_dir))):
            folder = os.path.join(results_dir, machine_dir, topic)
            for file in sorted(os.listdir(folder)):
                if not file.endswith(".json"):
                    continue
                with open(os.path.join(folder, file)) as f:
                    data = json.load(f)
                path = os.path.relpath(os.path.join(folder, file), ROOT)
                found.append(Result(path, machine_dir, topic, file.removesuffix(".json"), data))
    return found


def model_name(result: Result) -> str:
    """The model a run used, from its command line: a file's or folder's name, a random model's, or the
    default model."""
    command = result.data["command"]
    words = command.split()
    named = re.search(r"--nvllm-arg model=(\S+)", command)
    if "--random-model" in words:
        return "random " + words[words.index("--random-model") + 1]
    files = [w for w in words[3:] if w.endswith(".gguf")]
    path = (named.group(1) if named else words[3] if len(words) > 3 and not words[3].startswith("-")
            else files[0] if files else None)
    if path is None:
        return "SmolLM2-135M-Instruct Q4_1 (default)"
    return os.path.basename(path.rstrip("/")).removesuffix(".gguf")
