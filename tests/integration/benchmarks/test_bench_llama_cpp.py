"""`nvllm bench llama-cpp`: rounds that alternate llama-bench and nvllm on one GGUF file, the medians and the
ratios written with the command. llama.cpp is not built on CI machines (it takes 12-45 minutes on 2 cores), so
a stand-in executable prints what llama-bench prints with `-o json` (the fields the bench reads) and records
the arguments it was called with; the docs' figures come from the real llama-bench (the result files name it)."""

import json
import os
import stat
import subprocess
import sys

import pytest

from tests.support.smollm2_wheel import GGUF_NAME, wheel_dir

pytestmark = pytest.mark.integration

STAND_IN = """#!/usr/bin/env python3
import json, sys
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
print(json.dumps([{"n_prompt": int(args["-p"]), "n_gen": 0, "avg_ts": 100.0},
                  {"n_prompt": 0, "n_gen": int(args["-n"]), "avg_ts": 20.0}]))
"""


def test_rounds_alternate_the_two_engines_on_one_file(tmp_path):
    gguf = os.path.join(wheel_dir(), GGUF_NAME)  # the default model's file
    stand_in = tmp_path / "llama-bench"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "vs.json"
    subprocess.run([sys.executable, "-m", "frontend.cli.main", "bench", "llama-cpp", gguf, "--llama-bench",
                    str(stand_in), "--llama-bench-args", "--repack 0", "--input-len", "32", "--output-len", "6",
                    "--num-iters", "2", "--rounds", "2", "--threads", "1", "--max-model-len", "256",
                    "--output-json", str(out)], check=True, timeout=600)
    calls = [json.loads(line) for line in (tmp_path / "llama-bench.calls").read_text().splitlines()]
    assert len(calls) == 2 and all(c[:2] == ["-m", gguf] for c in calls)
    assert calls[0][2:] == ["-p", "32", "-n", "6", "-t", "1", "-r", "3", "-o", "json", "--repack", "0"]
    result = json.loads(out.read_text())
    assert result["command"].startswith("nvllm bench llama-cpp")
    figures = result["results"]
    assert len(figures["rounds"]) == 2 and figures["llama_cpp_tg_tok_s"] == 20.0
    ours = figures["rounds"][0]["nvllm"]
    assert ours["prefill_tok_s"] > 0 and ours["decode_tok_s"] > 0
    assert figures["decode_nvllm_over_llama_cpp"] == round(figures["nvllm_decode_tok_s"] / 20.0, 2)


def test_a_model_that_is_not_a_gguf_file_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "frontend.cli.main", "bench", "llama-cpp", str(tmp_path),
                          "--llama-bench", "/bin/true"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "MODEL must be a .gguf file" in out.stderr
    assert not os.path.exists(tmp_path / "vs.json")
