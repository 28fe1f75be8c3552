"""safetensors interop with the reference implementation (the Python `safetensors` package).

A file the package writes is read by tandem (`tandem st-info --json --data`) with the same
names, dtypes, shapes, metadata and exact bytes; a file tandem writes (`tandem st-write`,
through st_write) is byte-identical to the package's own serialisation and loads back in
the package with identical contents.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import TensorSpec, deserialize, serialize  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402


def tandem_bin() -> Path:
    build = os.environ.get("TANDEM_BUILD_DIR")
    if not build:
        pytest.fail("TANDEM_BUILD_DIR is not set (run through ctest)")
    path = Path(build) / "tandem"
    if not path.exists():
        pytest.fail(f"{path} is missing: build the `tandem` target first")
    return path


def run_tandem(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(tandem_bin()), *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


def st_info(path: Path) -> dict:
    r = run_tandem("st-info", str(path), "--json", "--data")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def numpy_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261129)
    return {
        "model.embed.weight": rng.standard_normal((7, 5)).astype(np.float32),
        "layers.0.attn.q_proj.weight": rng.standard_normal((4, 6)).astype(np.float16),
        "layers.0.norm.weight": rng.standard_normal(3).astype(np.float64),
        "counts": rng.integers(-(2**40), 2**40, size=(2, 2, 2), dtype=np.int64),
        "ids": rng.integers(-(2**31), 2**31 - 1, size=9, dtype=np.int32),
        "bytes": rng.integers(0, 256, size=(3, 1), dtype=np.uint8),
        "small": rng.integers(-128, 128, size=5, dtype=np.int8),
        "mask": rng.integers(0, 2, size=4).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "caf\u00e9": np.arange(6, dtype=np.uint16).reshape(2, 3),
    }


NP_DTYPE = {
    np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8", np.dtype(bool): "BOOL", np.dtype(np.uint16): "U16",
}


def test_tandem_reads_a_file_the_package_wrote(tmp_path):
    tensors = numpy_tensors()
    path = tmp_path / "numpy.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "caf\u00e9"})
    info = st_info(path)

    assert info["size"] == path.stat().st_size
    assert info["metadata"] == {"format": "np", "note": "caf\u00e9"}
    got = {t["name"]: t for t in info["tensors"]}
    assert sorted(got) == sorted(tensors)
    for name, arr in tensors.items():
        t = got[name]
        assert t["dtype"] == NP_DTYPE[arr.dtype], name
        assert t["shape"] == list(arr.shape), name
        assert t["bytes"] == arr.nbytes, name
        assert bytes.fromhex(t["data"]) == np.ascontiguousarray(arr).tobytes(), name
        assert t["supported"] == (t["dtype"] in ("F32", "F16", "BF16")), name
    # offsets ascend and tile the data section exactly, as the package lays it out
    offs = sorted((t["offset"], t["bytes"]) for t in info["tensors"])
    end = 0
    for off, n in offs:
        assert off == end
        end += n
    assert 8 + info["header_size"] + end == info["size"]


def raw_specs(rng):
    """bf16 and fp8 have no numpy dtype: pass raw bytes through TensorSpec."""
    bf16 = rng.integers(0, 2**16, size=(3, 4), dtype=np.uint16)
    f8 = rng.integers(0, 256, size=6, dtype=np.uint8)
    f32 = rng.standard_normal((2, 3)).astype(np.float32)
    keep = [bf16, f8, f32]
    specs = {
        "fc.weight": TensorSpec(dtype="bfloat16", shape=[3, 4], data_ptr=bf16.ctypes.data, data_len=bf16.nbytes),
        "scale": TensorSpec(dtype="float8_e4m3fn", shape=[6], data_ptr=f8.ctypes.data, data_len=f8.nbytes),
        "norm.weight": TensorSpec(dtype="float32", shape=[2, 3], data_ptr=f32.ctypes.data, data_len=f32.nbytes),
    }
    raw = {"fc.weight": ("BF16", [3, 4], bf16.tobytes()), "scale": ("F8_E4M3", [6], f8.tobytes()),
           "norm.weight": ("F32", [2, 3], f32.tobytes())}
    return specs, raw, keep


def test_tandem_reads_bf16_and_fp8_the_package_wrote(tmp_path):
    specs, raw, _keep = raw_specs(np.random.default_rng(7))
    path = tmp_path / "raw.safetensors"
    path.write_bytes(serialize(specs, metadata={"format": "pt"}))
    info = st_info(path)
    got = {t["name"]: t for t in info["tensors"]}
    assert sorted(got) == sorted(raw)
    for name, (dtype, shape, data) in raw.items():
        assert got[name]["dtype"] == dtype
        assert got[name]["shape"] == shape
        assert bytes.fromhex(got[name]["data"]) == data
    assert got["fc.weight"]["supported"] and not got["scale"]["supported"]


def header_order(image: bytes) -> list[str]:
    n = int.from_bytes(image[:8], "little")
    return [k for k in json.loads(image[8:8 + n]) if k != "__metadata__"]


def test_st_write_output_is_byte_identical_to_the_package(tmp_path):
    tensors = numpy_tensors()
    ref = serialize({name: TensorSpec(dtype=str(arr.dtype) if arr.dtype != bool else "bool",
                                      shape=list(arr.shape), data_ptr=arr.ctypes.data,
                                      data_len=arr.nbytes)
                     for name, arr in tensors.items()}, metadata={"format": "np"})
    # The package orders tensors by dtype then name; hand them over in that order.
    spec = {"metadata": {"format": "np"},
            "tensors": [{"name": name, "dtype": NP_DTYPE[tensors[name].dtype],
                         "shape": list(tensors[name].shape),
                         "data": np.ascontiguousarray(tensors[name]).tobytes().hex()}
                        for name in header_order(ref)]}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / "tandem.safetensors"
    r = run_tandem("st-write", str(out), str(spec_path))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == ref


def test_package_reads_a_file_st_write_wrote(tmp_path):
    tensors = numpy_tensors()
    _specs, raw, _keep = raw_specs(np.random.default_rng(11))
    entries = [{"name": name, "dtype": NP_DTYPE[arr.dtype], "shape": list(arr.shape),
                "data": np.ascontiguousarray(arr).tobytes().hex()} for name, arr in tensors.items()]
    entries += [{"name": "raw." + name, "dtype": d, "shape": s, "data": b.hex()}
                for name, (d, s, b) in raw.items()]
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"metadata": {"source": "tandem"}, "tensors": entries}))
    out = tmp_path / "tandem.safetensors"
    r = run_tandem("st-write", str(out), str(spec_path))
    assert r.returncode == 0, r.stderr

    image = out.read_bytes()
    loaded = dict(deserialize(image))
    assert sorted(loaded) == sorted(e["name"] for e in entries)
    for e in entries:
        assert loaded[e["name"]]["shape"] == e["shape"]
        assert bytes(loaded[e["name"]]["data"]) == bytes.fromhex(e["data"])
    with safetensors.safe_open(str(out), framework="np") as f:
        assert f.metadata() == {"source": "tandem"}
        for name, arr in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == arr.dtype and got.shape == arr.shape
            assert got.tobytes() == np.ascontiguousarray(arr).tobytes()


def test_st_info_reports_corrupt_files_clearly(tmp_path):
    path = tmp_path / "bad.safetensors"
    good = serialize({"w": TensorSpec(dtype="float32", shape=[4], data_ptr=np.zeros(4, np.float32).ctypes.data,
                                      data_len=16)})
    path.write_bytes(good[:-3])
    r = run_tandem("st-info", str(path))
    assert r.returncode == 1
    assert str(path) in r.stderr and '"w"' in r.stderr and "past the end" in r.stderr
    r = run_tandem("st-info", str(tmp_path / "missing.safetensors"))
    assert r.returncode == 1 and "cannot open" in r.stderr
