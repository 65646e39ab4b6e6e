"""repro.studies.mismatch_faults: each injected fault changes exactly the tensors it names, the way it says."""

import pytest
import torch

from repro.studies import mismatch_faults as mf
from repro.fp8.quant import dequantize_block, quantize_block
from repro.model.tiny import build_tiny_model
from repro.rollout.fp8_view import FP8WeightView


@pytest.fixture(scope="module")
def weights():
    return {k: v.clone() for k, v in build_tiny_model(0).state_dict().items()}


def test_scale_converted_twice_serves_twice_the_weight():
    w = torch.randn(130, 200, generator=torch.Generator().manual_seed(0))
    q, s = quantize_block(w, "e4m3fn")
    once = dequantize_block(q, s)
    assert torch.equal(mf.doubled_twice(w), 2 * once)  # x2 is exact in binary floating point


def test_each_fault_touches_only_its_tensors(weights):
    plain = FP8WeightView()(weights)

    def changed(fault, **kw):
        view = mf.FaultedView(fault, **kw)
        served = view(weights)
        differ = sorted(n for n in served if not torch.equal(served[n], plain[n]))
        return set(view.changed), differ

    names, differ = changed(mf.Fault("x", double_scale="experts:3"))
    assert names == {"model.layers.3.mlp.experts.gate_up_proj", "model.layers.3.mlp.experts.down_proj"}
    assert differ == sorted(names)
    names, _ = changed(mf.Fault("x", double_scale="all"))
    view = FP8WeightView()
    view(weights)
    assert names == set(view.quantised)
    names, differ = changed(mf.Fault("x", fp8_also=mf.ROUTER))  # the hash layer's gate scores with a weight too
    assert names == {f"model.layers.{i}.mlp.gate.weight" for i in range(4)} and differ == sorted(names)
    names, _ = changed(mf.Fault("x", fp8_also=mf.HEAD))
    assert names == {"lm_head.weight"}
    names, _ = changed(mf.Fault("x", fp8_also=mf.COMPRESSOR))
    # 3 compressed layers x (kv_proj, gate_proj) + 2 CSA indexers x (kv_proj, gate_proj, scorer weights_proj)
    assert len(names) == 12 and all("compressor" in n for n in names)
    names, differ = changed(mf.Fault("x", redraw_hash=True), seed=3)
    assert names == {"model.layers.0.mlp.gate.tid2eid"} and differ == sorted(names)
    stale = {k: v.clone() for k, v in build_tiny_model(1).state_dict().items()}
    names, differ = changed(mf.Fault("x", stale_experts=True), stale=stale)
    assert names == set(differ) and \
        {n.split(".mlp.")[1] for n in names} == {"experts.gate_up_proj", "experts.down_proj"}


def test_a_fault_that_touches_nothing_is_refused(weights):
    with pytest.raises(ValueError, match="touched no tensor"):
        mf.FaultedView(mf.Fault("x", fp8_also=r"no_such_tensor$"))(weights)


def test_fault_table_sets_k1_against_amds():
    rows = [{"fault": "a", "source": "s", "seed": 0, "k1": 0.2, "ess": 0.9},
            {"fault": "a", "source": "s", "seed": 1, "k1": 0.4, "ess": 0.8}]
    table = mf.fault_frame(rows)
    assert table.loc[0, "k1"] == pytest.approx(0.3) and table.loc[0, "k1 / AMD's"] == pytest.approx(0.3 / 0.4706)


def test_seeds_given_as_text_are_refused_naming_the_parameter():
    """papermill's ``-p seeds '[0]'`` hands the notebook the text '[0]'; the studies say so instead of failing
    inside torch.manual_seed."""
    from repro.studies.mismatch_sources import checked_seeds

    assert checked_seeds([0, 1]) == [0, 1]
    for bad in ("[0]", [], [0.5], [True], None):
        with pytest.raises(ValueError, match="study_seeds: expected a non-empty list of integer seeds"):
            checked_seeds(bad, "study_seeds")
