"""A GGUF import that fits the machine: tensors go through one at a time (the file's pages dropped as they are
read), so the import's resident memory grows by a fraction of the file, not by the file; the kept tensors' blocks
are written without a float copy; and a file nvllm cannot import (cut short, not a GGUF, an unknown tensor type,
no tokenizer) is refused before anything is written, naming the file and the problem."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from tests.support.gguf_weights import gguf_rows
from tests.support.gguf_writing import add_tiny_tokenizer

pytestmark = pytest.mark.integration

HIDDEN, INTER, LAYERS = 1024, 2816, 18  # Q8_0: about 200 MB of blocks


def _write(path: str, tokenizer: bool = True, layers: int = LAYERS) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    vocab = add_tiny_tokenizer(writer) if tokenizer else 261
    for key, value in (("block_count", layers), ("context_length", 256), ("embedding_length", HIDDEN),
                       ("feed_forward_length", INTER), ("head_count", 8), ("head_count_kv", 2)):
        getattr(writer, f"add_{key}")(value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (256, HIDDEN), "attn_v": (256, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN),
              "ffn_down": (HIDDEN, INTER)}

    def blocks(name: str, shape: tuple[int, int], seed: int) -> None:
        raw = gguf_rows("q8_0", *shape, seed=seed, size=0.02)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    blocks("token_embd.weight", (vocab, HIDDEN), 0)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        for j, (name, shape) in enumerate(shapes.items()):
            blocks(f"blk.{i}.{name}.weight", shape, 10 * i + j)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# VmHWM, not getrusage's ru_maxrss: Linux carries a parent's maxrss into a child it starts
_CHILD = """
import json, sys
import torch, transformers  # the engine's own baseline, and the tokenizer's reader
from engine_core.weights.gguf_import import import_gguf
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) * 1024
before = status("VmRSS")
import_gguf(sys.argv[1], sys.argv[2])
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


def test_an_import_holds_one_tensor_at_a_time_not_the_file(tmp_path):
    path = str(tmp_path / "big.gguf")
    _write(path)
    size = os.path.getsize(path)
    assert size > 180e6
    out = subprocess.run([sys.executable, "-c", _CHILD, path, str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=300, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    grown = figures["peak"] - figures["before"]
    # reading the tensors through the file's memory map kept all of it resident (grown > size); read one at a
    # time (the largest is 3 MB here), the growth is a tensor or two and the tokenizer converter's own modules
    # (about 70 MB, whatever the file's size)
    assert grown < 0.5 * size, (grown, size)
    folder = tmp_path / "out"
    assert (folder / "weights.quantized").stat().st_size > 0.95 * size  # the blocks as they are
    assert (folder / "model.safetensors").stat().st_size < 1e6  # only the norms as floats: no copy of the blocks


def _patch_first_tensor_type(path: str, type_id: int) -> None:
    """Rewrites the type of the file's first tensor (token_embd.weight) in its header."""
    data = bytearray(open(path, "rb").read())
    name = b"token_embd.weight"
    at = data.index(name) + len(name)
    dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * dims, type_id)
    open(path, "wb").write(bytes(data))


def test_files_nvllm_cannot_import_are_refused_naming_the_file_and_the_problem(tmp_path):
    from engine_core.weights.gguf_import import import_gguf

    good = str(tmp_path / "good.gguf")
    _write(good, layers=1)
    cut = str(tmp_path / "cut.gguf")
    with open(good, "rb") as f, open(cut, "wb") as g:
        g.write(f.read(os.path.getsize(good) // 2))
    junk = str(tmp_path / "junk.gguf")
    with open(junk, "wb") as f:
        f.write(os.urandom(4096))
    unknown = str(tmp_path / "unknown-type.gguf")
    with open(good, "rb") as f, open(unknown, "wb") as g:
        g.write(f.read())
    _patch_first_tensor_type(unknown, 99)
    bare = str(tmp_path / "no-tokenizer.gguf")
    _write(bare, tokenizer=False, layers=1)
    for path, problem in ((cut, "is truncated"), (junk, "GGUF magic"), (unknown, "99"),
                          (bare, "has no tokenizer in its metadata")):
        out = tmp_path / f"out-{os.path.basename(path)}"
        with pytest.raises(ValueError, match=problem) as info:
            import_gguf(path, str(out))
        assert path in str(info.value)
        assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(f".{out.name}.tmp")]

