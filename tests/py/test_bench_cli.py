"""tandem bench, the whole flow on the tiny shape: it runs end to end (on the CPU backend
without a GPU), saves a GGUF that gguf-py reads, and every derived number of its JSON report
agrees with what gguf-py finds in that file and with the report's own measured times;
--only measures just the parts named, the report names the run's TANDEM_ settings, and
scripts/bench_compare.py pairs two sides' rows."""
import json
import math
import os
import subprocess
import sys

import pytest
from gguf import GGUFReader

SRC = os.environ.get("TANDEM_SOURCE_DIR", ".")
BUILD = os.environ.get("TANDEM_BUILD_DIR", "build")
TANDEM = os.path.join(BUILD, "tandem")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    if not os.access(TANDEM, os.X_OK):
        pytest.skip(f"{TANDEM} is not built")
    d = tmp_path_factory.mktemp("bench")
    model, report = d / "tiny.gguf", d / "bench.json"
    p = subprocess.run(
        [TANDEM, "bench", "--shape", "tiny", "--iters", "3", "--save", str(model),
         "--json", str(report)],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    with open(report) as f:
        return {"json": json.load(f), "stdout": p.stdout, "model": str(model)}


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_table_lists_every_measurement(bench):
    out = bench["stdout"]
    for row in ("copy bandwidth", "weight bytes per decode token", "decode, 1K context",
                "decode, 32K context", "verify 4 tokens", "verify 8 tokens",
                "verify 16 tokens", "verify 32 tokens",
                "verify 16 tokens (32K context)", "rollback",
                "prefill, 1K-token prompt", "draft step", "block of 8 (8 positions + 7 rows)",
                "block of 4 (4 positions + 3 rows)", "process split, no MPS", "process split, MPS",
                "projected speculative, no MPS", "sampling: 15 drafts, temp 0.8",
                "sampling: accept 16, temp 0.8", "sampling: 15 drafts, + top_p 0.95",
                "sampling: accept 16, + top_p 0.95"):
        assert row in out, row
    assert "[cpu backend, f32 context, f32 inputs; queued by the host in" in out


def test_weight_and_state_bytes_match_the_saved_file(bench):
    j, r = bench["json"], GGUFReader(bench["model"])
    assert j["model_bytes"] == os.path.getsize(bench["model"])
    n_main = int(r.fields["qwen35.block_count"].contents()) - \
        int(r.fields["qwen35.nextn_predict_layers"].contents())
    total = 0
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_main:
            continue  # the MTP block never runs
        if t.name == "token_embd.weight":
            total += int(t.n_bytes) // int(t.shape[1])  # one row looked up
        else:
            total += int(t.n_bytes)
    assert j["weight_bytes_per_token"] == total

    f = {k: int(r.fields[f"qwen35.{k}"].contents()) for k in (
        "attention.head_count_kv", "attention.key_length", "ssm.time_step_rank",
        "ssm.state_size", "ssm.group_count", "ssm.conv_kernel", "full_attention_interval")}
    n_attn = n_main // f["full_attention_interval"]
    n_delta = n_main - n_attn
    d = f["ssm.state_size"]
    conv_ch = 2 * f["ssm.group_count"] * d + f["ssm.time_step_rank"] * d
    for key, ctx in (("1k", 1024), ("32k", 32768)):
        kv = n_attn * ctx * 2 * f["attention.head_count_kv"] * f["attention.key_length"] * 4
        rec = n_delta * 2 * (f["ssm.time_step_rank"] * d * d +
                             (f["ssm.conv_kernel"] - 1) * conv_ch) * 4
        assert j["decode"][key]["context"] == ctx
        assert j["decode"][key]["state_bytes_per_token"] == kv + rec


def test_derived_numbers_follow_from_the_measured_times(bench):
    j = bench["json"]
    bw = j["copy_bandwidth_gbps"]
    assert bw > 0
    limit = j["weight_bytes_per_token"] / (bw * 1e9) * 1e3
    assert close(j["bandwidth_limit_ms"], limit)
    for key in ("1k", "32k"):
        dec = j["decode"][key]
        assert dec["ms"] > 0 and dec["iters"] == 3
        assert close(dec["tok_s"], 1e3 / dec["ms"])
        assert close(dec["fraction_of_limit"], limit / dec["ms"])
        with_state = (j["weight_bytes_per_token"] + dec["state_bytes_per_token"]) / (bw * 1e9) * 1e3
        assert close(dec["fraction_of_limit_with_state"], with_state / dec["ms"])
    d1 = j["decode"]["1k"]["ms"]
    for n in ("4", "8", "16", "32"):
        assert close(j["verify"][n]["ratio_to_decode"], j["verify"][n]["ms"] / d1)
    v_long = j["verify"]["16_32k"]
    assert v_long["ms"] > 0 and v_long["iters"] == 3
    assert close(v_long["ratio_to_decode"], v_long["ms"] / j["decode"]["32k"]["ms"])
    assert close(j["draft"]["ratio_to_decode"], j["draft"]["ms"] / d1)
    # the draft step of blocks of 8 and 4: 8 or 4 new positions and that many rows less one
    drafts = {16: j["draft"]["ms"]}
    for b in (8, 4):
        row = j["draft"]["block%d" % b]
        assert row["ms"] > 0 and row["iters"] == 3, row
        assert close(row["ratio_to_decode"], row["ms"] / d1)
        drafts[b] = row["ms"]
    # on the CPU backend queueing a step is running it: nearly all of the step, never more
    assert 0.5 * j["draft"]["ms"] <= j["draft"]["host_ms"] <= j["draft"]["ms"]
    pf = j["prefill"]
    assert pf["tokens"] == 1024 and pf["chunk"] == 64 and 3 <= pf["iters"] <= 3
    assert pf["ms"] > 0 and close(pf["tok_s"], 1024e3 / pf["ms"])
    assert j["draft"]["backend"] == "cpu"
    # the CPU's drafter: an f32 context and exact inputs (TANDEM_DRAFT_ACT=bf16 is a GPU's)
    assert j["draft"]["numerics"] == "f32 context, f32 inputs"
    smp = j["sampling"]
    assert [s["sampler"] for s in smp] == ["temperature 0.8", "temperature 0.8, top_p 0.95",
                                           "greedy"]
    for s in smp:
        for part in ("draw", "accept"):
            assert s[part]["ms"] > 0 and s[part]["iters"] == 3, s
            assert close(s[part]["ratio_to_decode"], s[part]["ms"] / d1)

    sp = j["split"]["no_mps"]
    assert sp["measured"], sp
    assert close(sp["cost_us"], sp["step_us"] - sp["local_us"])
    step_ms = j["draft"]["ms"] + j["verify"]["16"]["ms"] + j["rollback"]["ms"] + sp["cost_us"] * 1e-3
    assert close(sp["fraction_of_step"], sp["cost_us"] * 1e-3 / step_ms)
    for tau in (4, 6, 8):
        assert close(sp["projected_tok_s"][str(tau)], tau * 1e3 / step_ms)
    step8 = drafts[8] + j["verify"]["8"]["ms"] + j["rollback"]["ms"] + sp["cost_us"] * 1e-3
    assert set(sp["projected_tok_s_blocks_of_8"]) == {"4", "6"}
    for tau in (4, 6):
        assert close(sp["projected_tok_s_blocks_of_8"][str(tau)], tau * 1e3 / step8)
    # the best of plain decoding and blocks of 4, 8, 16, each draft accepted with the q that
    # gives tau tokens a step with blocks of 16
    steps = {1: d1}
    for b in (4, 8, 16):
        steps[b] = (drafts[b] + j["verify"][str(b)]["ms"] + j["rollback"]["ms"]
                    + sp["cost_us"] * 1e-3)
    for tau in (4, 6, 8):
        lo, hi = 0.0, 1.0
        for _ in range(100):
            q = (lo + hi) / 2
            if sum(q ** k for k in range(16)) < tau:
                lo = q
            else:
                hi = q
        q = (lo + hi) / 2
        rates = {b: sum(q ** k for k in range(b)) * 1e3 / steps[b] for b in steps}
        best = max(rates, key=rates.get)
        got = sp["projected_tok_s_picked"][str(tau)]
        assert got["block"] == best and close(got["tok_s"], rates[best]), (tau, got, rates)
        assert close(got["tok_s"], max(rates.values()))
    if not sp["gpu"]:
        assert not j["split"]["mps"]["measured"]
    # a pass's first two runs where passes become CUDA graphs: none on the CPU
    for step in ("decode", "verify16"):
        for run in ("direct", "record"):
            g = j["graphs"][step][run]
            if sp["gpu"]:
                assert g["ms"] > 0 and g["ratio_to_replay"] > 0, (step, run, g)
            else:
                assert g["ms"] is None, (step, run, g)
                assert g["why"] == "forward passes are not recorded here (no CUDA graphs)"
    assert any("32K context" in n for n in j["notes"])

    # the targets, each judged on the numbers above
    tg = j["targets"]
    assert set(tg) == {"decode_fraction_of_limit", "verify16_ratio", "draft_ratio",
                       "split_mps_fraction"}
    want = {"decode_fraction_of_limit": (0.85, True, j["decode"]["1k"]["fraction_of_limit"]),
            "verify16_ratio": (1.3, False, j["verify"]["16"]["ratio_to_decode"]),
            "draft_ratio": (0.35, False, j["draft"]["ratio_to_decode"]),
            "split_mps_fraction": (0.01, False, None)}  # not measured without a GPU
    for key, (goal, at_least, value) in want.items():
        g = tg[key]
        assert g["goal"] == goal and g["at_least"] == at_least, key
        if value is None:
            assert g["value"] is None and g["met"] is None, key
        else:
            assert close(g["value"], value), key
            assert g["met"] == (value >= goal if at_least else value <= goal), key
    assert "targets (H200, 27B): decode 1K of the limit >= 85%:" in bench["stdout"]


def test_saved_file_is_readable_by_gguf_py(bench):
    r = GGUFReader(bench["model"])
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.ffn_down.weight"] == "Q6_K"
    assert types["blk.1.ffn_down.weight"] == "Q4_K"
    assert types["blk.0.ssm_out.weight"] == "Q5_K"
    assert types["blk.0.ssm_alpha.weight"] == "F32"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 1024
    assert len(r.fields["tokenizer.ggml.merges"].data) == 736
    assert r.fields["tokenizer.ggml.pre"].contents() == "qwen35"
    with open(os.path.join(SRC, "tests/data/chat/Qwen3.5-4B.jinja"), encoding="utf-8") as f:
        assert r.fields["tokenizer.chat_template"].contents() == f.read()


def test_only_measures_the_parts_asked_for(tmp_path):
    if not os.access(TANDEM, os.X_OK):
        pytest.skip(f"{TANDEM} is not built")
    report = tmp_path / "only.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env.update(TANDEM_MMQ_REFILL="late", TANDEM_RUNTIME_DIR=str(tmp_path))
    p = subprocess.run(
        [TANDEM, "bench", "--shape", "tiny", "--iters", "2", "--only", "decode,verify16",
         "--json", str(report)],
        capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    with open(report) as f:
        j = json.load(f)
    skipped = "not measured: --only left it out"
    assert j["decode"]["1k"]["ms"] > 0 and j["decode"]["1k"]["iters"] == 2
    assert j["verify"]["16"]["ms"] > 0 and j["rollback"]["ms"] > 0
    for row in (j["decode"]["32k"], j["verify"]["32"], j["verify"]["16_32k"], j["verify"]["4"],
                j["verify"]["8"], j["prefill"],
                j["prefill_chunked"], j["draft"], j["draft"]["block8"], j["draft"]["block4"],
                j["sampling"][0]["draw"],
                j["sampling"][2]["accept"], j["graphs"]["decode"]["direct"],
                j["graphs"]["verify16"]["record"]):
        assert row["ms"] is None and row["why"] == skipped, row
    for end in ("no_mps", "mps"):
        assert j["split"][end] == {"measured": False, "why": skipped}
    assert "--only: the parts left out were not measured" in j["notes"]
    # the run's TANDEM_ settings (not the _DIR ones) are part of the report
    assert j["environment"] == {"TANDEM_MMQ_REFILL": "late"}
    assert "TANDEM_ settings in the environment: TANDEM_MMQ_REFILL=late" in j["notes"]
    assert p.stdout.count("(" + skipped + ")") == 22, p.stdout  # 32K, verify 4, 8 and 32,
    # verify 16 at 32K, 2 prefills, 4 graph rows, the draft steps of 16, 8 and 4, 6 sampling
    # rows, 2 split rows


def test_only_refuses_an_unknown_part():
    if not os.access(TANDEM, os.X_OK):
        pytest.skip(f"{TANDEM} is not built")
    for only in ("decode,bogus", "decode,,verify16", ""):
        p = subprocess.run([TANDEM, "bench", "--shape", "tiny", "--only", only],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (only, p.stdout, p.stderr)
        assert "(the parts: decode, decode32k, verify16, verify32, prefill, prefill-chunked, " \
            "draft, sampling, split, verify16-32k, verify-short, graphs)" in p.stderr, p.stderr
        assert p.stdout == ""


COMPARE = os.path.join(SRC, "scripts", "bench_compare.py")


def test_bench_compare_pairs_the_rows_of_both_sides():
    if not os.access(TANDEM, os.X_OK):
        pytest.skip(f"{TANDEM} is not built")
    p = subprocess.run(
        [sys.executable, COMPARE, "--a", TANDEM, "--env-b", "TANDEM_PDL=off", "--rounds", "2",
         "--", "--shape", "tiny", "--iters", "1", "--only", "decode,verify16"],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"a: {TANDEM}" and lines[1] == f"b: {TANDEM} TANDEM_PDL=off"
    rows = {ln[:16].strip(): ln[16:].split() for ln in lines[4:]}
    assert sorted(rows) == ["decode 1K", "rollback", "verify 16"]  # only what was measured
    for label, cells in rows.items():
        a, b, ma, mb, d = [float(c) for c in cells[:2]], [float(c) for c in cells[2:4]], \
            float(cells[4]), float(cells[5]), float(cells[6])
        assert all(v > 0 for v in a + b), label
        assert math.isclose(ma, sum(a) / 2, abs_tol=2e-3) and math.isclose(mb, sum(b) / 2, abs_tol=2e-3)
        assert math.isclose(d, ((b[0] - a[0]) + (b[1] - a[1])) / 2, abs_tol=2e-3), label


def test_bench_compare_reports_a_failed_run():
    if not os.access(TANDEM, os.X_OK):
        pytest.skip(f"{TANDEM} is not built")
    p = subprocess.run(
        [sys.executable, COMPARE, "--a", TANDEM, "--rounds", "1", "--",
         "--shape", "tiny", "--only", "bogus"],
        capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "exited 2" in p.stderr and "no part named 'bogus'" in p.stderr
    p = subprocess.run([sys.executable, COMPARE, "--a", TANDEM, "--", "--json", "x.json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--json is added here" in p.stderr
