"""The BF16 trainer's GEMM paths (repro.train.bf16_gemm): the fp32 path's semantics on hand-built values, that it
covers every GEMM of the tiny DeepSeek-V4 forward and backward, how a path is chosen and forced, and the trainer
on each path (tested both ways, whatever CPU runs the tests: each test names the path it pins).

What these do not cover: speed (benchmarks/bench_bf16_gemm.py; docs/performance.md), and the native path's own
rounding, which is torch's and differs by CPU (oneDNN's FP32 blocking on AVX512/AMX, ATen's fallback elsewhere):
the native-path tests here compare a trainer with itself, never with pinned numbers.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from repro import metric_keys as K
from repro.model import layouts
from repro.model.hyper_connection import use_entrywise_hyper_connections
from repro.model.tiny import build_tiny_model
from repro.recipes import load_recipe
from repro.train import bf16_gemm
from repro.train.bf16_gemm import ENV_VAR, FP32, NATIVE, BF16GemmError, FP32Gemms, resolve_bf16_gemm
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings
from repro.train.precision import cast_for_training
from repro.train.stable_shapes import PaddedRowsLinear
from test_trainer_contract import make_batch, with_old_logprobs

BF = torch.bfloat16
E7, E8, E16 = 2.0**-7, 2.0**-8, 2.0**-16
GEMM_OPS = {"mm", "addmm", "bmm", "_grouped_mm", "baddbmm"}


def bf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(BF)


class BF16Gemms(TorchDispatchMode):
    """Counts aten GEMMs that receive a BF16 operand (what the fp32 path must leave none of)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in GEMM_OPS and any(isinstance(a, torch.Tensor) and a.dtype == BF for a in args):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def no_forced_path(monkeypatch):
    """These tests name their paths; a ``REPRO_BF16_GEMM`` set for the whole session would conflict with them."""
    monkeypatch.delenv(ENV_VAR, raising=False)


# -- the fp32 path's arithmetic, on hand-built values ---------------------------------------------------------------

def test_fp32_path_accumulates_in_fp32():
    """1 + 2^-8 + 2^-8 = 1 + 2^-7 (a BF16 number). Adding in BF16 would round 1 + 2^-8 to 1 (a tie, to even) twice
    and give 1; an FP32 accumulator keeps both halves."""
    x, w = bf([[1.0, E8, E8]]), bf([[1.0, 1.0, 1.0]])
    with FP32Gemms():
        y = F.linear(x, w)
    assert y.dtype == BF and y.item() == 1 + E7


def test_fp32_path_rounds_once_forward_and_both_gradients():
    """Sums 1 + 2^-8 + 2^-16: exact in FP32, rounded once to BF16 it is 1 + 2^-7 (just above the tie). Rounding the
    partial sum 1 + 2^-8 first would land on 1 (ties to even) and stay there. The same sum is made to appear as the
    output, as the input gradient and as the weight gradient of a linear."""
    with FP32Gemms():
        y = F.linear(bf([[1.0, E8, E16]]), bf([[1.0, 1.0, 1.0]]))
    assert y.item() == 1 + E7
    x = bf([[1.0]]).requires_grad_()  # grad_x = g @ W = 1 + 2^-8 + 2^-16
    w = bf([[1.0], [E8], [E16]]).requires_grad_()
    with FP32Gemms():
        out = F.linear(x, w)
    out.backward(bf([[1.0, 1.0, 1.0]]))
    assert x.grad.dtype == BF and x.grad.item() == 1 + E7
    x = bf([[1.0], [E8], [E16]]).requires_grad_()  # grad_W = g^T @ x = the same sum over rows
    w = bf([[1.0]]).requires_grad_()
    with FP32Gemms():
        out = F.linear(x, w)
    out.backward(bf([[1.0], [1.0], [1.0]]))
    assert w.grad.dtype == BF and w.grad.item() == 1 + E7


def test_fp32_path_products_are_exact():
    """(1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 needs 15 bits: exact in FP32, then rounded once to 1 + 2^-6."""
    a = bf([[1 + E7]])
    with FP32Gemms():
        assert torch.mm(a, a).item() == 1 + 2.0**-6
        assert (a @ bf([[1 + E7, 1.0]])).tolist() == [[1 + 2.0**-6, 1 + E7]]


def _fp64(func, args, absolute: bool = False) -> torch.Tensor:
    """``func`` on the operands in FP64 (with ``absolute``: of their absolute values); grouped_mm group by group."""
    wide = [(x.abs() if absolute else x).double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in args]
    if func is torch._grouped_mm:
        rows, weights, ends = wide[0], wide[1], wide[2].tolist()
        return torch.cat([rows[s:e] @ weights[i] for i, (s, e) in enumerate(zip([0, *ends], ends))])
    return func(*wide)


@pytest.mark.parametrize("op", ["mm", "bmm", "matmul", "linear", "grouped_mm", "einsum", "addmm"])
def test_every_gemm_function_gives_the_correctly_rounded_result(op):
    """Random BF16 operands at the tiny model's sizes (K = 128). An FP32 sum of 128 exact products is within
    128 * 2^-24 * sum|a*b| of the exact one: for an output not cancelled below sum|a*b| / 64 that is under an
    eighth of a BF16 ulp, so it equals the exact (FP64) result rounded once to BF16, except where the exact value
    lies that close to a rounding boundary -- then it is the other neighbour, 1 ulp away. Cancelled outputs are
    skipped: their ulps measure the cancellation, whatever the accumulator."""
    g = torch.Generator().manual_seed(len(op))
    a, b = torch.randn(8, 96, 128, generator=g).to(BF), torch.randn(8, 128, 64, generator=g).to(BF)
    offs = torch.tensor([96 * 3, 96 * 5, 96 * 8], dtype=torch.int32)
    calls = {
        "mm": (torch.mm, (a[0], b[0])), "bmm": (torch.bmm, (a, b)), "matmul": (torch.matmul, (a, b)),
        "linear": (F.linear, (a[0], b[0].T.contiguous())), "einsum": (torch.einsum, ("bij,bjk->bik", a, b)),
        "grouped_mm": (torch._grouped_mm, (a.reshape(-1, 128), b[:3], offs)),
        "addmm": (torch.addmm, (b[1, 0], a[0], b[0])),
    }
    func, args = calls[op]
    with FP32Gemms():
        ours = func(*args)
    exact, scale = _fp64(func, args), _fp64(func, args, absolute=True)
    assert ours.dtype == BF and ours.shape == exact.shape
    kept = exact.abs() * 64 >= scale
    assert float(kept.float().mean()) > 0.8
    ours, rounded, exact = ours[kept], exact[kept].to(BF), exact[kept]
    differ = ours != rounded
    assert float(differ.float().mean()) < 1e-3
    # where they differ, ours is the exact value's other BF16 neighbour: adjacent to the rounded one, the exact
    # value between the two
    ours, rounded, exact = ours[differ], rounded[differ], exact[differ]
    assert torch.equal(torch.nextafter(rounded, ours), ours)
    low, high = torch.minimum(rounded, ours).double(), torch.maximum(rounded, ours).double()
    assert bool(((low <= exact) & (exact <= high)).all())


def test_calls_torch_refuses_still_fail_and_others_pass_through():
    """A stand-in as strict as torch: BF16 with FP32 operands raises as without the mode; FP32 GEMMs and non-GEMM
    BF16 ops are torch's own, bit for bit."""
    x = torch.randn(4, 8)
    with FP32Gemms(), pytest.raises(RuntimeError):
        F.linear(x.to(BF), torch.randn(3, 8))
    w = torch.randn(3, 8)
    with FP32Gemms():
        fp32, soft = F.linear(x, w), torch.softmax(x.to(BF), -1)
    assert torch.equal(fp32, F.linear(x, w)) and torch.equal(soft, torch.softmax(x.to(BF), -1))
    out = torch.empty(4, 3, dtype=BF)
    with FP32Gemms():
        returned = torch.mm(x.to(BF), w.T.to(BF), out=out)
    assert returned is out and torch.equal(out, (x.to(BF).float() @ w.T.to(BF).float()).to(BF))


def _tiny_bf16():
    model = cast_for_training(build_tiny_model(0), "bf16", keep_fp32=layouts.keeps_fp32)
    use_entrywise_hyper_connections(model)
    return model


def test_the_mode_leaves_no_bf16_gemm_in_the_tiny_models_forward_and_backward():
    """Every GEMM of the BF16 tiny DeepSeek-V4 -- linears, o_a_proj's bmm, the routed experts' grouped_mm, the
    attention's and the hyper-connections' matmuls, the routers -- forward and backward: none reaches aten with a
    BF16 operand under the mode; without it, all of them do."""
    model = _tiny_bf16()
    ids = torch.randint(3, 20, (16, 12), generator=torch.Generator().manual_seed(0))
    counts = {}
    for name, context in (("native", None), ("fp32", FP32Gemms)):
        seen = BF16Gemms()
        with seen:
            with context() if context else torch.enable_grad():
                logits = model(input_ids=ids, use_cache=False).logits
            logits.float().logsumexp(-1).sum().backward()
        counts[name] = seen.calls
        assert logits.dtype == BF
        assert model.lm_head.weight.grad.dtype == BF and model.model.layers[1].mlp.experts.down_proj.grad.dtype == BF
        model.zero_grad(set_to_none=True)
    assert counts["fp32"] == []
    assert len(counts["native"]) > 100 and {"mm", "bmm", "_grouped_mm"} <= set(counts["native"])


# -- choosing and forcing a path -----------------------------------------------------------------------------------

def test_auto_follows_the_cpus_capability_unless_the_environment_or_the_recipe_names_a_path(monkeypatch):
    for capable, path in ((True, NATIVE), (False, FP32)):
        monkeypatch.setattr(bf16_gemm, "native_bf16_matmul", lambda capable=capable: capable)
        assert resolve_bf16_gemm("auto") == path
        assert resolve_bf16_gemm(NATIVE) == NATIVE and resolve_bf16_gemm(FP32) == FP32
        for forced in (NATIVE, FP32):
            monkeypatch.setenv(ENV_VAR, forced)
            assert resolve_bf16_gemm("auto") == forced and resolve_bf16_gemm(forced) == forced
        monkeypatch.setenv(ENV_VAR, "auto")
        assert resolve_bf16_gemm("auto") == path
        monkeypatch.delenv(ENV_VAR)


def test_unknown_or_conflicting_paths_are_refused(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(BF16GemmError, match=f"{ENV_VAR}='fast'"):
        resolve_bf16_gemm("auto")
    monkeypatch.setenv(ENV_VAR, FP32)
    with pytest.raises(BF16GemmError, match=f"actor.bf16_gemm is 'native' but {ENV_VAR}='fp32'"):
        resolve_bf16_gemm(NATIVE)
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(BF16GemmError, match="actor.bf16_gemm: 'fp16'"):
        resolve_bf16_gemm("fp16")
    with pytest.raises(Exception, match="bf16_gemm"):
        load_recipe("tiny-cpu", ["actor.bf16_gemm=fast"])


def test_onednn_limited_to_avx2_reads_as_a_cpu_without_native_bf16():
    """``DNNL_MAX_CPU_ISA=AVX2`` (how docs/performance.md forces an AVX2-only CPU's slow native path on a CPU with
    native BF16) makes oneDNN report no BF16 kernel, so ``auto`` takes the fp32 path; on an AVX2-only CPU that is
    the answer anyway."""
    code = "from repro.train.bf16_gemm import cpu_bf16_facts as f; import json; print(json.dumps(f()))"
    env = {**os.environ, "DNNL_MAX_CPU_ISA": "AVX2"}
    env.pop(ENV_VAR, None)
    facts = json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                      text=True).stdout)
    assert facts["onednn_bf16"] is False and facts["path"] == FP32


# -- the trainer on each path --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_model():
    return build_tiny_model(seed=0)


def _trainer(model, path, **settings):
    stated = TrainerSettings(**{"dtype": "bf16", "max_tokens_per_micro_batch": 16384, "temperature": 0.8, **settings})
    return EmbeddedTrainer(copy.deepcopy(model), stated, bf16_gemm=path)


@pytest.mark.parametrize("path", [NATIVE, FP32])
def test_a_trainer_on_each_path_is_deterministic_and_records_its_path(base_model, path, tmp_path):
    """Pins the path named by the parameter. Two trainers from the same weights take the same step bit for bit;
    the step's metrics say which path it took; the saved state records it."""
    batch = make_batch(base_model)
    first, second = _trainer(base_model, path), _trainer(base_model, path)
    assert first.bf16_gemm == path
    metrics = first.train_step(with_old_logprobs(first, batch))
    assert metrics == second.train_step(with_old_logprobs(second, batch))
    assert metrics[K.BF16_GEMM_FP32] == (1.0 if path == FP32 else 0.0)
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()))
    first.save(tmp_path / "state")
    assert json.loads((tmp_path / "state" / "trainer_state.json").read_text())["bf16_gemm"] == path
    # the stable GEMM shapes serve oneDNN's primitive cache: the native path only
    padded = sum(isinstance(m, PaddedRowsLinear) for m in first.model.modules())
    assert padded == (43 if path == NATIVE else 0)


def test_the_fp32_path_trains_with_no_bf16_gemm_and_near_the_native_path(base_model):
    """Pins both paths. A training step on the fp32 path (one update thread: the dispatch check is per thread) runs
    no BF16 aten GEMM; its log-probs differ from the native path's by BF16 rounding only (the two paths add the
    same exact products in another order), far less than BF16 differs from FP32."""
    batch = make_batch(base_model)
    fp32_path, native = _trainer(base_model, FP32), _trainer(base_model, NATIVE)
    seen = BF16Gemms()
    with seen:
        lp_fp32 = fp32_path.logprobs(batch).logprobs
        fp32_path.train_step(with_old_logprobs(fp32_path, batch))
    assert seen.calls == []
    lp_native = native.logprobs(batch).logprobs
    lp_full = EmbeddedTrainer(copy.deepcopy(base_model), TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384,
                                                                         temperature=0.8)).logprobs(batch).logprobs
    gap, bf16_error = float((lp_fp32 - lp_native).abs().max()), float((lp_native - lp_full).abs().max())
    assert gap < 0.05 and gap <= bf16_error


def test_a_resume_on_the_other_path_is_refused(base_model, tmp_path, monkeypatch):
    _trainer(base_model, FP32).save(tmp_path / "state")
    with pytest.raises(BF16GemmError, match="'fp32' path; this one would take 'native'.*actor.bf16_gemm=fp32"):
        _trainer(base_model, NATIVE).load(tmp_path / "state")
    monkeypatch.setenv(ENV_VAR, FP32)
    _trainer(base_model, "auto").load(tmp_path / "state")  # forced to the path the run started on: continues


def test_an_fp32_trainer_has_no_bf16_path(base_model):
    trainer = EmbeddedTrainer(copy.deepcopy(base_model),
                              TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=0.8),
                              bf16_gemm=FP32)
    assert trainer.bf16_gemm is None
    assert K.BF16_GEMM_FP32 not in trainer.train_step(with_old_logprobs(trainer, make_batch(base_model)))
    with pytest.raises(BF16GemmError):
        EmbeddedTrainer(copy.deepcopy(base_model),
                        TrainerSettings(dtype="fp32", max_tokens_per_micro_batch=16384, temperature=1.0),
                        bf16_gemm="fast")


def test_the_recipe_field_reaches_the_trainer():
    for path in (NATIVE, FP32):
        recipe = load_recipe("tiny-cpu", [f"actor.bf16_gemm={path}"])
        assert EmbeddedTrainer.from_recipe(recipe).bf16_gemm == path
    assert load_recipe("tiny-cpu").actor.bf16_gemm == "auto"


def test_stand_in_nn_linear_subclass_is_covered():
    """The padded linear (a subclass of nn.Linear) goes through F.linear too: the mode covers it."""
    layer = nn.Linear(8, 4, bias=False).to(BF)
    layer.__class__ = PaddedRowsLinear
    seen = BF16Gemms()
    with seen, FP32Gemms():
        layer(torch.randn(3, 8).to(BF)).float().sum().backward()
    assert seen.calls == []
