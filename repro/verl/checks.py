"""What keeps a recipe from running on verl 0.9.1 (``engine: verl``), field by field; read when the recipe is loaded
(``repro.recipes.backends.engine_problems``), so it imports nothing of verl. Each refusal names the field and why
verl cannot express it; what verl runs differently but close is a departure (``mapping.departures``), not refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe

FP8_BLOCK = [128, 128]  # vLLM's fp8 weight quantisation, which verl's rollout.quantization=fp8 turns on


def verl_problems(recipe: "Recipe") -> list[str]:
    """One ``field: why`` line per recipe value verl cannot express (empty: it can run the recipe)."""
    r, problems = recipe, []
    if r.cluster.gpus_per_node == 0 or r.cluster.accelerator == "cpu":
        problems.append("cluster.gpus_per_node: verl's Megatron trainer and vLLM rollout need GPUs (NVIDIA or ROCm)")
    if r.actor.backend != "megatron":
        problems.append(f"actor.backend: verl runs the recipe with model_engine=megatron; {r.actor.backend!r} is ours")
    if r.rollout.backend != "vllm":
        problems.append(f"rollout.backend: verl's rollout here is vLLM; {r.rollout.backend!r} is ours")
    if r.optim.weight_decay_rule != "megatron":
        problems.append("optim.weight_decay_rule: verl steps megatron's optimizer, whose param groups spare biases and "
                        "1-D parameters from weight decay; 'all' cannot be expressed")
    if r.actor.dtype == "fp32":
        problems.append("actor.dtype: verl's Megatron engine computes in bfloat16 or float16 (megatron.dtype); an FP32 "
                        "trainer cannot be expressed")
    if r.rollout.activation_dtype != "bf16":
        problems.append("rollout.activation_dtype: verl serves vLLM in rollout.dtype bfloat16 here; fp32 GEMM outputs "
                        "are repro's embedded engine only")
    if r.rollout.weight_format == "fp8_block":
        if r.rollout.fp8_scale == "ue8m0":
            problems.append("rollout.fp8_scale: verl's rollout.quantization=fp8 makes fp32 block scales; power-of-two "
                            "(UE8M0) scales cannot be asked for")
        if r.rollout.activation_quant == "none":
            problems.append("rollout.activation_quant: verl's fp8 rollout quantises activations too (W8A8, dynamic "
                            "per token group); FP8 weights with BF16 activations cannot be expressed")
        elif r.rollout.activation_group != 128:
            problems.append(f"rollout.activation_group: vLLM's fp8 block scheme groups 128 channels per activation "
                            f"scale; {r.rollout.activation_group} cannot be asked for")
        if list(r.rollout.fp8_block) != FP8_BLOCK:
            problems.append(f"rollout.fp8_block: verl's fp8 rollout quantises in {FP8_BLOCK} blocks; "
                            f"{list(r.rollout.fp8_block)} cannot be asked for")
        if r.weight_sync.quantize_on != "rollout":
            problems.append("weight_sync.quantize_on: verl sends BF16 weights and vLLM quantises them as it loads "
                            "them; quantising on the trainer cannot be expressed")
    if r.algorithm.kl_coef != 0:
        problems.append("algorithm.kl_coef: verl's KL term (actor.use_kl_loss with kl_loss_type, or a KL in the "
                        "reward) is not repro's penalty; only 0 (no KL, AMD's) is mapped")
    if r.algorithm.prompts_per_step % r.algorithm.updates_per_step:
        problems.append(f"algorithm.updates_per_step: verl's ppo_mini_batch_size is prompts_per_step / "
                        f"updates_per_step prompts, which {r.algorithm.prompts_per_step} / "
                        f"{r.algorithm.updates_per_step} is not")
    if r.model.path.startswith("builtin:"):
        problems.append(f"model.path: verl loads a Hugging Face checkpoint folder, not {r.model.path!r}")
    if r.reward.verifier == "math_verify" and r.verl.reward_function is None:
        problems.append("reward.verifier: math_verify needs the math-verify package on every verl worker; set "
                        "verl.reward_function to a file that calls it, or use verifier dapo")
    nodes = r.verl.nodes or r.actor.nodes
    gpus = nodes * r.cluster.gpus_per_node
    if r.cluster.gpus_per_node and nodes > r.cluster.num_nodes:
        problems.append(f"verl.nodes: {nodes} nodes asked for, the cluster has {r.cluster.num_nodes}")
    if r.cluster.gpus_per_node and r.actor.num_workers != gpus:
        problems.append(f"actor.num_workers: verl runs one trainer rank on every GPU of its {nodes} node(s), "
                        f"{gpus}, not {r.actor.num_workers} (verl.nodes, or actor.nodes when it is unset)")
    model_parallel = r.actor.tensor_parallel * r.actor.pipeline_parallel
    if r.cluster.gpus_per_node and gpus % model_parallel:
        problems.append(f"verl.nodes: {gpus} GPUs do not hold whole trainer replicas of TP x PP = {model_parallel}")
    if r.cluster.gpus_per_node and gpus % r.rollout.tensor_parallel:
        problems.append(f"rollout.tensor_parallel: {gpus} colocated GPUs do not split into vLLM replicas of "
                        f"{r.rollout.tensor_parallel}")
    return problems
