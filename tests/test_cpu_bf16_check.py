"""`repro check`'s cpu_bf16 row: which BF16 GEMM path the trainer takes on this CPU (repro.train.bf16_gemm) and the
`make repro` time to expect, on hand-made facts; and the facts gathered on this machine.

The expected times are the measured figures of docs/performance.md (a 2-core machine); a laptop with other cores
differs, which the row cannot know: it says "on 2 cores"."""

from __future__ import annotations

from repro.readiness import checks as C
from repro.readiness.checks import FAIL, PASS, SKIP, WARN
from repro.readiness.facts import gather_facts
from repro.recipes import load_recipe
from repro.train.bf16_gemm import ENV_VAR
from test_cluster_checks import AMD, TINY, by_name, laptop_facts

AVX512_BF16 = {"cpu_capability": "AVX512", "avx512_bf16": True, "amx": False, "onednn_bf16": True, "env": None,
               "path": "native", "gflops": {"native": 201.9, "fp32": 92.1}}
AVX2 = {"cpu_capability": "AVX2", "avx512_bf16": False, "amx": False, "onednn_bf16": False, "env": None,
        "path": "fp32", "gflops": {"native": 3.2, "fp32": 90.0}}


def row(recipe, **bf16):
    return C.check_cpu_bf16(recipe, laptop_facts(cpu_bf16=bf16))


def test_each_kind_of_cpu_gets_its_path_and_expected_time():
    fast, slow = row(TINY, **AVX512_BF16), row(TINY, **AVX2)
    assert fast.status == slow.status == PASS
    assert "oneDNN BF16 yes; BF16 GEMMs on the native path (actor.bf16_gemm=auto)" in fast.detail
    assert f"~{C.EXPECTED_MAKE_REPRO_S['native']} s" in fast.detail and "native 201.9, fp32 92.1" in fast.detail
    assert "torch capability AVX2" in slow.detail and "BF16 GEMMs on the fp32 path" in slow.detail
    assert slow.detail.endswith(f"expected make repro on 2 cores: ~{C.EXPECTED_MAKE_REPRO_S['fp32']} s")


def test_the_slow_native_path_forced_on_an_avx2_cpu_warns_with_the_fix():
    result = row(load_recipe("tiny-cpu", ["actor.bf16_gemm=native"]), **AVX2)
    assert result.status == WARN and "native path (actor.bf16_gemm=native)" in result.detail
    assert f"~{C.EXPECTED_MAKE_REPRO_S['native without oneDNN BF16']} s" in result.detail
    assert "actor.bf16_gemm: auto" in result.fix
    forced = row(TINY, **{**AVX512_BF16, "env": "fp32"})  # the fp32 path forced where native is fast: allowed
    assert forced.status == PASS and "fp32 path (actor.bf16_gemm=auto, REPRO_BF16_GEMM=fp32)" in forced.detail


def test_a_conflict_fails_and_a_probe_error_warns_and_gpu_recipes_skip():
    conflict = row(load_recipe("tiny-cpu", ["actor.bf16_gemm=native"]), **{**AVX2, "env": "fp32"})
    assert conflict.status == FAIL and f"but {ENV_VAR}='fp32'" in conflict.detail
    broken = C.check_cpu_bf16(TINY, laptop_facts(cpu_bf16={"error": "RuntimeError: no oneDNN"}))
    assert broken.status == WARN and "RuntimeError: no oneDNN" in broken.detail
    assert C.check_cpu_bf16(TINY, laptop_facts()).status == WARN  # not gathered
    assert row(AMD, **AVX2).status == SKIP
    assert row(load_recipe("tiny-cpu", ["actor.dtype=fp32"]), **AVX2).status == SKIP


def test_this_machines_facts_name_a_path_and_measure_both(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    facts = gather_facts(TINY)
    assert facts.cpu_bf16["path"] in ("native", "fp32")
    assert facts.cpu_bf16["path"] == ("native" if facts.cpu_bf16["onednn_bf16"] else "fp32")
    assert set(facts.cpu_bf16["gflops"]) == {"native", "fp32"} and min(facts.cpu_bf16["gflops"].values()) > 0
    assert by_name(C.run_checks(TINY, facts))["cpu_bf16"].status == PASS


def test_an_unknown_environment_value_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "fast")
    facts = gather_facts(TINY)
    assert facts.cpu_bf16["path"] is None and "REPRO_BF16_GEMM='fast'" in facts.cpu_bf16["refused"]
    result = by_name(C.run_checks(TINY, facts))["cpu_bf16"]
    assert result.status == FAIL and "REPRO_BF16_GEMM='fast'" in result.detail
