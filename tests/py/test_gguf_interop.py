"""GGUF interoperability with gguf-py, the reference implementation that llama.cpp's converters use.

- A file written by gguf-py's GGUFWriter is read by `tandem gguf-info --json` with exactly the
  keys, types, values, shapes and offsets gguf-py wrote (offsets recomputed here from the
  tensor sizes and the alignment, and checked against GGUFReader).
- A file written by our writer (`test_gguf --write-sample`) is read by gguf-py's GGUFReader
  with the same content, tensor bytes included.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import GGUFValueType as VT  # noqa: E402

SOURCE = Path(os.environ.get("TANDEM_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TANDEM_BUILD_DIR", SOURCE / "build"))
TANDEM = BUILD / "tandem"
TEST_GGUF = BUILD / "tests" / "test_gguf"


def gguf_info(path, *extra):
    out = subprocess.run([str(TANDEM), "gguf-info", str(path), "--json", "--max-items", "0", *extra],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def f32(x):
    return float(np.float32(x))


# --- a gguf-py file read by tandem ---------------------------------------------------------

def write_with_gguf_py(path, alignment=None):
    w = gguf.GGUFWriter(str(path), "testarch")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -32000)
    w.add_uint32("t.u32", 4294967295)
    w.add_int32("t.i32", -123456789)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", 1.0 / 3.0)
    w.add_bool("t.bool", False)
    w.add_string("t.str", "Grüße, 世界\n")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, 0.1])
    w.add_array("t.arr_str", ["<|im_start|>", "", "Ġhello"])
    w.add_array("t.arr_bool", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("token_embd.weight", np.arange(24, dtype=np.float32).reshape(3, 8))
    w.add_tensor("blk.0.attn_norm.weight", np.ones((2, 16), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.full((2, 68), 7, dtype=np.uint8), raw_dtype=QT.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", np.full((2, 288), 9, dtype=np.uint8), raw_dtype=QT.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


EXPECTED_KV = [
    # key, type, value (arrays: elem_type, value)
    ("general.architecture", "STRING", "testarch"),
    ("t.u8", "UINT8", 250),
    ("t.i8", "INT8", -7),
    ("t.u16", "UINT16", 65000),
    ("t.i16", "INT16", -32000),
    ("t.u32", "UINT32", 4294967295),
    ("t.i32", "INT32", -123456789),
    ("t.f32", "FLOAT32", f32(0.1)),
    ("t.u64", "UINT64", "18446744073709551615"),  # above 2^63-1: a decimal string
    ("t.i64", "INT64", -(2**63)),
    ("t.f64", "FLOAT64", 1.0 / 3.0),
    ("t.bool", "BOOL", False),
    ("t.str", "STRING", "Grüße, 世界\n"),
    ("t.arr_i32", "ARRAY", ("INT32", [1, -2, 3])),
    ("t.arr_f32", "ARRAY", ("FLOAT32", [0.5, f32(0.1)])),
    ("t.arr_str", "ARRAY", ("STRING", ["<|im_start|>", "", "Ġhello"])),
    ("t.arr_bool", "ARRAY", ("BOOL", [True, False])),
    ("t.nested", "ARRAY", ("ARRAY", [{"elem_type": "INT32", "length": 2, "value": [1, 2]},
                                     {"elem_type": "INT32", "length": 1, "value": [3]}])),
]

# name, type, shape (ggml order: row length first), bytes
EXPECTED_TENSORS = [
    ("token_embd.weight", "F32", [8, 3], 96),
    ("blk.0.attn_norm.weight", "F16", [16, 2], 64),
    ("blk.0.attn_q.weight", "Q8_0", [64, 2], 2 * 2 * 34),
    ("blk.0.ffn_up.weight", "Q4_K", [512, 2], 2 * 2 * 144),
]


def check_gguf_py_file(path, alignment):
    doc = gguf_info(path)
    assert doc["version"] == 3
    assert doc["alignment"] == alignment
    assert doc["file_size"] == path.stat().st_size

    kv = [(m["key"], m["type"], (m["elem_type"], m["value"]) if m["type"] == "ARRAY" else m["value"])
          for m in doc["metadata"]]
    expected = list(EXPECTED_KV)
    if alignment != 32:
        expected.insert(1, ("general.alignment", "UINT32", alignment))
    assert kv == expected
    for m in doc["metadata"]:
        if m["type"] == "ARRAY":
            assert m["length"] == len(m["value"])

    offset = 0
    for i, (t, (name, typ, shape, nbytes)) in enumerate(zip(doc["tensors"], EXPECTED_TENSORS, strict=True)):
        assert t == {"index": i, "name": name, "type": typ, "type_id": int(QT[typ]), "shape": shape,
                     "n_elements": int(np.prod(shape)), "bytes": nbytes, "offset": offset}
        offset += -(-nbytes // alignment) * alignment
    assert doc["totals"] == {"n_tensors": 4, "n_elements": 24 + 32 + 128 + 1024,
                             "bytes": 96 + 64 + 136 + 576}
    assert doc["data_offset"] % alignment == 0

    # GGUFReader agrees on where every tensor's bytes are.
    reader = gguf.GGUFReader(str(path))
    assert [t.data_offset for t in reader.tensors] == \
        [doc["data_offset"] + t["offset"] for t in doc["tensors"]]


def test_gguf_py_file_reads_with_exact_keys_values_shapes_offsets(tmp_path):
    path = tmp_path / "py.gguf"
    write_with_gguf_py(path)
    check_gguf_py_file(path, 32)


def test_gguf_py_file_with_custom_alignment_reads_with_its_offsets(tmp_path):
    path = tmp_path / "py64.gguf"
    write_with_gguf_py(path, alignment=64)
    check_gguf_py_file(path, 64)


def test_gguf_info_text_lists_keys_and_tensors(tmp_path):
    path = tmp_path / "py.gguf"
    write_with_gguf_py(path)
    out = subprocess.run([str(TANDEM), "gguf-info", str(path), "--max-items", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "version:     3" in lines
    assert any(line.split() == ["13", "[INT32]", "t.arr_i32", "=", "[3]", "[1,", "-2,", "...]"]
               for line in lines)
    assert any(line.split() == ["3", "Q4_K", "[512,", "2]", "1024", "576", "320", "blk.0.ffn_up.weight"]
               for line in lines)
    assert lines[-1] == "total: 4 tensors, 1208 elements, 872 bytes (0.00 GiB)"


def test_gguf_info_reports_a_corrupt_file_without_crashing(tmp_path):
    path = tmp_path / "py.gguf"
    write_with_gguf_py(path)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:300])
    out = subprocess.run([str(TANDEM), "gguf-info", str(cut)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("tandem gguf-info: " + str(cut) + ": ")
    assert out.stderr.endswith(": n_tensors = 4 tensor infos cannot fit in the 276 bytes after the header\n")
    cut.write_bytes(data[:-1])
    out = subprocess.run([str(TANDEM), "gguf-info", str(cut), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert out.stdout == ""
    assert "tensor 'blk.0.ffn_up.weight': 576 bytes" in out.stderr
    assert "past the end of the file (%d bytes)" % (len(data) - 1) in out.stderr
    bad = tmp_path / "v1.gguf"
    bad.write_bytes(data[:4] + (1).to_bytes(4, "little") + data[8:])
    out = subprocess.run([str(TANDEM), "gguf-info", str(bad), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert out.stdout == ""
    assert "GGUF version 1" in out.stderr


# --- a tandem file read by gguf-py ---------------------------------------------------------

def pattern(size, k):
    return bytes((7 * i + k) & 0xFF for i in range(size))


SAMPLE_SCALARS = {
    "general.architecture": (VT.STRING, "tandem-test"),
    "test.u8": (VT.UINT8, 200),
    "test.i8": (VT.INT8, -100),
    "test.u16": (VT.UINT16, 60000),
    "test.i16": (VT.INT16, -30000),
    "test.u32": (VT.UINT32, 4000000000),
    "test.i32": (VT.INT32, -2000000000),
    "test.f32": (VT.FLOAT32, 3.25),
    "test.bool": (VT.BOOL, True),
    "test.str": (VT.STRING, 'héllo\n"world"'),
    "test.u64": (VT.UINT64, 1099511627777),
    "test.i64": (VT.INT64, -9000000000000000000),
    "test.f64": (VT.FLOAT64, -2.718281828459045),
}
SAMPLE_ARRAYS = {
    "test.arr_u8": (VT.UINT8, [0, 1, 255]),
    "test.arr_i8": (VT.INT8, [-128, 0, 127]),
    "test.arr_u16": (VT.UINT16, [0, 65535]),
    "test.arr_i16": (VT.INT16, [-32768, 32767]),
    "test.arr_u32": (VT.UINT32, [0, 1, 4294967295]),
    "test.arr_i32": (VT.INT32, [-2147483648, -1, 2147483647]),
    "test.arr_f32": (VT.FLOAT32, [0.5, -1.25, f32(3.0e38)]),
    "test.arr_bool": (VT.BOOL, [True, False, True]),
    "test.arr_u64": (VT.UINT64, [0, 2**64 - 1]),
    "test.arr_i64": (VT.INT64, [-(2**63), 2**63 - 1]),
    "test.arr_f64": (VT.FLOAT64, [0.1, -1e300]),
    "test.arr_str": (VT.STRING, ["a", "", "ü"]),
}
SAMPLE_TENSORS = [
    # name, type, shape (ggml order), bytes
    ("token_embd.weight", QT.F32, [8, 3], 96),
    ("blk.0.attn_q.weight", QT.F16, [16, 2], 64),
    ("blk.0.attn_k.weight", QT.Q8_0, [64, 2], 136),
    ("blk.0.ffn_up.weight", QT.Q4_K, [256, 2, 1], 288),
]


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "tandem.gguf"
    out = subprocess.run([str(TEST_GGUF), "--write-sample", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return path


def test_our_file_reads_in_gguf_py_with_the_same_content(sample):
    reader = gguf.GGUFReader(str(sample))
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(SAMPLE_SCALARS) + list(SAMPLE_ARRAYS) + \
        ["test.arr_empty", "test.arr_nested", "test.arr_nested3"]
    assert reader.fields["GGUF.version"].contents() == 3
    for key, (vtype, value) in SAMPLE_SCALARS.items():
        assert fields[key].types == [vtype], key
        assert fields[key].contents() == value, key
    for key, (vtype, value) in SAMPLE_ARRAYS.items():
        assert fields[key].types == [VT.ARRAY, vtype], key
        assert fields[key].contents() == value, key
    assert fields["test.arr_empty"].types == [VT.ARRAY]
    assert fields["test.arr_empty"].contents() == []

    # gguf-py flattens nested arrays into parts: [elem type, count, then each element's parts].
    nested = fields["test.arr_nested"]
    value_parts = [p.tolist() for p in nested.parts[nested.data[0] - 2:]]
    assert value_parts == [[int(VT.INT32)], [3], [1], [2], [3], [int(VT.INT32)], [1], [4]]
    assert nested.types[:3] == [VT.ARRAY, VT.ARRAY, VT.INT32]

    assert [t.name for t in reader.tensors] == [t[0] for t in SAMPLE_TENSORS]
    for k, (t, (name, qtype, shape, nbytes)) in enumerate(zip(reader.tensors, SAMPLE_TENSORS, strict=True)):
        assert t.tensor_type == qtype, name
        assert t.shape.tolist() == shape, name
        assert t.n_bytes == nbytes, name
        assert t.data_offset % 32 == 0
        assert t.data.tobytes() == pattern(nbytes, k), name


def test_our_file_reads_the_same_in_gguf_info_and_gguf_py(sample):
    doc = gguf_info(sample)
    reader = gguf.GGUFReader(str(sample))
    assert doc["data_offset"] == reader.data_offset
    assert [(t["name"], t["type_id"], t["shape"], t["bytes"], doc["data_offset"] + t["offset"])
            for t in doc["tensors"]] == \
        [(t.name, int(t.tensor_type), t.shape.tolist(), t.n_bytes, t.data_offset) for t in reader.tensors]
    for m in doc["metadata"]:
        field = reader.fields[m["key"]]
        if m["type"] == "ARRAY" and m["elem_type"] not in ("ARRAY",):
            want = field.contents()
            if m["elem_type"] == "UINT64":
                want = [v if v < 2**63 else str(v) for v in want]
            assert m["value"] == want, m["key"]
            assert m["length"] == len(want)
        elif m["type"] != "ARRAY":
            assert m["value"] == field.contents(), m["key"]
