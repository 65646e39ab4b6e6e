"""The weight stream of a Megatron world (repro.train.megatron.stream_weights): two real gloo ranks split TP 2,
PP 2, EP 2 or DP 2 stream exactly the tensors one process exports -- same names, torch.equal, each once, on the
stage's first rank only -- with every pickling collective made to raise; the export units it names weights by.
"""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed here: "
                                            "`make test-megatron` runs this lane in .venv-megatron")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from repro.recipes import load_recipe  # noqa: E402
from repro.train.megatron.stream_weights import export_unit, stream_order  # noqa: E402
from test_megatron_contract import one_thread  # noqa: E402,F401

TINY = ["actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.tiny:provider",
        "seed=3"]
# name -> (provider's recipe settings, layout settings); qwen3 exports HF names, stacking each layer's experts
LAYOUTS = {
    "tp2": ("tiny", ["actor.tensor_parallel=2"]),
    "pp2": ("tiny", ["actor.pipeline_parallel=2"]),
    "ep2": ("tiny", ["actor.expert_parallel=2"]),
    "dp2": ("tiny", []),
    "qwen3_ep2": ("qwen3", ["actor.expert_parallel=2"]),
    "qwen3_pp2_on_disk": ("qwen3", ["actor.pipeline_parallel=2", "rollout.backend=vllm"]),
}


def recipe_for(provider: str, model_dir: str, workers: int, extra: list[str]):
    base = TINY if provider == "tiny" else [
        "actor.dtype=fp32", "actor.backend=megatron", "actor.model_provider=repro.train.megatron.qwen3:provider",
        f"model.path={model_dir}"]
    return load_recipe("tiny-cpu", base + [f"actor.num_workers={workers}"] + extra)


def _refuse_pickling(*args, **kwargs):
    raise AssertionError("a pickling collective ran on the weight path")


def _rank_main(rank: int, world: int, port: int, out: str, model_dir: str) -> None:
    """Every layout in turn in one pair of processes (megatron's groups rebuilt between them): a process start
    and megatron's import cost more than a layout."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from megatron.core import parallel_state

    from repro.train.megatron.parallel import init_distributed_from_env
    from repro.train.megatron.trainer import MegatronTrainer

    init_distributed_from_env()
    for name in ("gather_object", "all_gather_object", "broadcast_object_list", "scatter_object_list"):
        setattr(dist, name, _refuse_pickling)
    c10d._object_to_tensor = _refuse_pickling  # what every object collective pickles with
    for layout, (provider, extra) in LAYOUTS.items():
        parallel_state.destroy_model_parallel()
        trainer = MegatronTrainer.from_recipe(recipe_for(provider, model_dir, world, extra))
        stage = list(trainer.stage_weights())
        whole = list(trainer.named_weights())
        save = {f"stage.{n}": t.contiguous().clone() for n, t in stage}
        save.update({f"whole.{n}": t.contiguous().clone() for n, t in whole})
        save_file(save, os.path.join(out, f"{layout}-rank{rank}.safetensors"), metadata={
            "sender": str(trainer.sync_sender()), "stage_names": ",".join(n for n, _ in stage),
            "whole_names": ",".join(n for n, _ in whole)})
    dist.barrier()


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from repro.model.tiny_qwen3_moe import build_tiny_math_qwen3_moe

    return build_tiny_math_qwen3_moe(tmp_path_factory.mktemp("qwen3") / "model", seed=0)


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, qwen3_dir):
    """Each layout's per-rank results: (tensors, metadata) of rank 0 and rank 1."""
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("streamed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(2, port, str(out), str(qwen3_dir)), nprocs=2, join=True, start_method="spawn")
    results = {}
    for layout in LAYOUTS:
        results[layout] = []
        for r in range(2):
            with safe_open(out / f"{layout}-rank{r}.safetensors", "pt") as f:
                meta = f.metadata()
            results[layout].append((load_file(out / f"{layout}-rank{r}.safetensors"), meta))
    return results


def reference_weights(provider: str, model_dir: str, extra: list[str]) -> dict[str, torch.Tensor]:
    """What the split ranks must stream: the tiny model's one-process export (its seeded weights do not depend on
    the split); for the Qwen3-MoE checkpoint, the checkpoint itself -- transformers' in-memory names with each
    layer's experts stacked, or the file's names (one tensor per expert and projection) when vLLM serves it."""
    if provider == "qwen3":
        if "rollout.backend=vllm" in extra:
            return load_file(os.path.join(model_dir, "model.safetensors"))
        from repro.model.hf_folder import load_tiny_model

        return load_tiny_model(model_dir).state_dict()
    from repro.train.megatron.trainer import MegatronTrainer

    return dict(MegatronTrainer.from_recipe(recipe_for(provider, model_dir, 1, [])).named_weights())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_ranks_stream_exactly_what_one_process_exports(layout, streamed, qwen3_dir, one_thread):
    provider, extra = LAYOUTS[layout]
    reference = reference_weights(provider, str(qwen3_dir), extra)
    ranks = streamed[layout]
    stages = 2 if "pp2" in layout else 1
    assert [m["sender"] for _, m in ranks] == (["0", "1"] if stages == 2 else ["0", "None"])
    sent = []
    for tensors, meta in ranks:  # a rank that does not lead its stage streams nothing
        names = [n for n in meta["stage_names"].split(",") if n]
        assert (len(names) > 0) == (meta["sender"] != "None")
        sent += [(n, tensors[f"stage.{n}"]) for n in names]
    assert sorted(n for n, _ in sent) == sorted(reference)  # every full weight exactly once over the stages
    for name, tensor in sent:
        assert tensor.dtype == reference[name].dtype and torch.equal(tensor, reference[name]), name
    whole_names = [n for n in ranks[0][1]["whole_names"].split(",") if n]
    assert sorted(whole_names) == sorted(reference) and ranks[1][1]["whole_names"] == ""
    for name in whole_names:  # named_weights: every stage on rank 0
        assert torch.equal(ranks[0][0][f"whole.{name}"], reference[name]), name


def test_export_units_keep_a_layers_experts_of_a_projection_together():
    names = ["embedding.word_embeddings.weight",
             "decoder.layers.0.self_attention.linear_qkv.weight",
             "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
             "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
             "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
             "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight",
             "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
             "decoder.layers.1.mlp.experts.linear_fc1.weight0",
             "decoder.layers.1.mlp.experts.linear_fc1.weight1",
             "decoder.layers.1.input_layernorm.weight",
             "output_layer.weight"]
    assert export_unit(names[2]) == export_unit(names[4]) == \
        "decoder.layers.0.mlp.experts.local_experts.*.linear_fc1.weight"
    assert export_unit(names[7]) == export_unit(names[8]) == "decoder.layers.1.mlp.experts.linear_fc1.weight*"
    assert stream_order(names, grouped=True) == [
        [names[0]], [names[1], names[6]], [names[2], names[4]], [names[3], names[5]], [names[7], names[8]],
        [names[9]], [names[10]]]
    assert stream_order(names, grouped=False) == [[n] for n in names]
