"""The LumenRL DeepSeek-V4 provider, our side of the seam only.

LumenRL's engine needs AMD's trainer image (ROCm GPUs, patched ROCm Megatron-LM, Lumen's DSV4 spec): it cannot run
here. The engine and its weight converter below are STAND-INS that record what the provider hands them; they test
the engine config the recipe produces (against AMD's published longrun config), the forward-only switch, and the
export of weights LumenRL keeps whole on every TP rank. Nothing here shows LumenRL's model itself is right.
"""

import os
import sys
import textwrap

import pytest
import torch

from repro.recipes import load_recipe
from repro.train.base import TrainerError
from repro.train.megatron import lumenrl_dsv4 as L

AMD = load_recipe("amd-dsv4-flash-mi308x", ["actor.model_provider=repro.train.megatron.lumenrl_dsv4:provider"])
# LumenRL examples/GRPO/configs/grpo_dsv4_flash_vllm_longrun.yaml (commit 2232f554), policy.training.megatron_cfg:
# every key the recipe determines, with the published value; moe.r3.enabled and seed feed the last two.
PUBLISHED_MEGATRON_CFG = {
    "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4, "expert_model_parallel_size": 4,
    "expert_tensor_parallel_size": 1, "num_experts": 256, "num_layers_in_first_pipeline_stage": 11,
    "num_layers_in_last_pipeline_stage": 10, "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall",
    "attention_softmax_in_fp32": True, "sequence_parallel": True, "recompute_granularity": "full",
    "recompute_method": "uniform", "recompute_num_layers": 1, "attention_backend": "flash",
    "use_packed_sequences": True, "log_probs_chunk_size": 1024,
    "moe_enable_routing_replay": True, "seed": 10086,
}
FLASH_LAYERS = 43

STAND_IN_ENGINE = '''
import os
import torch

class MegatronLumenDSV4Engine:
    """STAND-IN for LumenRL's engine: records its arguments, builds two weights as LumenRL marks them at TP 4."""
    created = []

    def __init__(self, model_config, engine_config, optimizer_config, model_name=""):
        self.engine_config, self.model_name = engine_config, model_name
        self.optimizer_config = optimizer_config
        MegatronLumenDSV4Engine.created.append(self)

    def initialize(self):
        self.forward_only = os.environ.get("LUMENRL_FORWARD_ONLY_INIT")
        model = torch.nn.Module()
        model.whole = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))   # every TP rank holds it whole
        model.whole.tensor_model_parallel, model.whole.partition_dim = True, 0
        model.whole._lumen_weight_partition_dim = None
        model.shard = torch.nn.Parameter(torch.ones(2, 3))                    # a real TP shard
        model.shard.tensor_model_parallel, model.shard.partition_dim = True, 1
        model.shard._lumen_weight_partition_dim = 1
        self.module, self._dims = model, "dims-of-the-checkpoint"
'''
STAND_IN_BRIDGE = '''
calls = []

def dsv4_megatron_to_hf(mapping, dims, **kwargs):
    """STAND-IN for LumenRL's converter: prefixes names, records what it was given."""
    calls.append((dict(mapping), dims, kwargs))
    for name, tensor in mapping.items():
        yield "redhat." + name, tensor

def _denormalize_redhat_key(key):
    return key.replace("redhat.", "hf.")
'''


@pytest.fixture
def stand_in_lumenrl(tmp_path, monkeypatch):
    package = tmp_path / "lumenrl" / "engine" / "training"
    package.mkdir(parents=True)
    for folder in (tmp_path / "lumenrl", tmp_path / "lumenrl" / "engine", package):
        (folder / "__init__.py").write_text("")
    (package / "megatron_lumen_dsv4_engine.py").write_text(textwrap.dedent(STAND_IN_ENGINE))
    (package / "dsv4_megatron_bridge.py").write_text(textwrap.dedent(STAND_IN_BRIDGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "lumenrl" or m.startswith("lumenrl.")]:
        monkeypatch.delitem(sys.modules, name)
    # full_names needs megatron's parallel state; the stand-in model's names are already full
    from repro.train.megatron import parallel

    monkeypatch.setattr(parallel, "full_names", lambda model: {n: n for n, _ in model.named_parameters()})
    model_dir = tmp_path / "DeepSeek-V4-Flash-BF16"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(f'{{"num_hidden_layers": {FLASH_LAYERS}}}')
    yield load_recipe("amd-dsv4-flash-mi308x", [f"model.path={model_dir}"])
    for name in [m for m in sys.modules if m == "lumenrl" or m.startswith("lumenrl.")]:
        sys.modules.pop(name)


def test_engine_config_equals_amds_published_megatron_cfg():
    assert L.engine_config(AMD, FLASH_LAYERS) == PUBLISHED_MEGATRON_CFG
    assert L.pipeline_stage_layers(43, 4) == (11, 10) and L.pipeline_stage_layers(43, 1) is None
    assert L.pipeline_stage_layers(8, 4) == (2, 2)
    with pytest.raises(TrainerError, match="3 layers cannot fill 4 stages"):
        L.pipeline_stage_layers(3, 4)


def test_provider_builds_forward_only_and_exports_whole_weights_once(stand_in_lumenrl, monkeypatch):
    monkeypatch.delenv(L.FORWARD_ONLY, raising=False)
    model, export = L.provider(stand_in_lumenrl)
    from lumenrl.engine.training import dsv4_megatron_bridge as bridge
    from lumenrl.engine.training.megatron_lumen_dsv4_engine import MegatronLumenDSV4Engine

    engine = MegatronLumenDSV4Engine.created[-1]
    assert engine.forward_only == "1" and L.FORWARD_ONLY not in os.environ  # set for initialize() only
    assert engine.model_name == stand_in_lumenrl.model.path and engine.optimizer_config == {}
    assert engine.engine_config == PUBLISHED_MEGATRON_CFG
    assert model is engine.module
    # what repro's gather hands over at TP 4: the whole weight four times over, the shard's four pieces
    gathered = {"whole": torch.cat([model.whole.detach()] * 4, dim=0), "shard": torch.ones(2, 12)}
    exported = export(gathered)
    assert set(exported) == {"hf.whole", "hf.shard"}
    assert torch.equal(exported["hf.whole"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(exported["hf.shard"], torch.ones(2, 12))
    mapping, dims, kwargs = bridge.calls[-1]
    assert dims == "dims-of-the-checkpoint"
    assert kwargs == {"pp_rank": 0, "pp_size": 1, "layers_per_pp_rank": None, "use_grouped_mlp": True}


def test_without_lumenrl_the_error_names_the_image(tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 43}')
    recipe = load_recipe("amd-dsv4-flash-mi308x", [f"model.path={tmp_path}"])
    with pytest.raises(TrainerError, match="needs lumenrl.engine.training.megatron_lumen_dsv4_engine.*"
                                           "Dockerfile.dsv4"):
        L.provider(recipe)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TrainerError, match="config.json: cannot read num_hidden_layers"):
        L.provider(recipe)
