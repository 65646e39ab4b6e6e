"""repro.cluster: the pure placement plan, the AMD layout on a simulated 3 x 8-GPU Ray cluster, the tiny
recipe on a local instance, and named errors for unplaceable groups, unreachable clusters and dead workers.

Ray starts slowly on 2 busy cores (~15-25 s a cluster), so each cluster is shared by one test class and
torn down with it; the two never run at once.
"""

import dataclasses
import os
import sys
import time

# Before Ray is imported anywhere: no token file in ~/.ray, no usage report, and no idle worker per
# logical CPU (the simulated nodes advertise 40 CPUs they do not have).
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

import pytest  # noqa: E402

from repro.cluster import ClusterError  # noqa: E402
from repro.cluster.placement import (  # noqa: E402
    ROLLOUT,
    TRAINER,
    PlacementError,
    create_placement_groups,
    format_placement_table,
    plan_placement,
    placement_table,
)
from repro.recipes import load_recipe  # noqa: E402

AMD = "amd-dsv4-flash-mi308x"
TINY = "tiny-cpu"


# -- (a) the pure plan -------------------------------------------------------------------------------------
def test_amd_plan_is_two_trainer_nodes_of_eight_and_one_rollout_node():
    plan = plan_placement(load_recipe(AMD))
    trainer, rollout = plan.group(TRAINER), plan.group(ROLLOUT)
    assert [g.name for g in plan.groups] == [TRAINER, ROLLOUT]
    assert trainer.bundles == tuple({"GPU": 1, "CPU": 4} for _ in range(16))
    assert (trainer.strategy, trainer.nodes, trainer.bundles_per_slice) == ("STRICT_PACK", 2, 8)
    assert len(trainer.slices) == 2 and trainer.distinct_slice_nodes
    assert rollout.bundles == ({"GPU": 8, "CPU": 8},)
    assert (rollout.strategy, rollout.nodes, rollout.avoid_groups) == ("STRICT_PACK", 1, (TRAINER,))
    assert trainer.totals() == {"GPU": 16, "CPU": 64}


def test_tiny_plan_is_one_cpu_bundle_per_group():
    plan = plan_placement(load_recipe(TINY))
    trainer, rollout = plan.group(TRAINER), plan.group(ROLLOUT)
    assert trainer.bundles == ({"CPU": 1},) and rollout.bundles == ({"CPU": 1},)
    assert trainer.nodes == rollout.nodes == 1
    assert rollout.avoid_groups == () and not trainer.distinct_slice_nodes
    assert "trainer: 1 x {'CPU': 1}" in plan.describe()


def test_plan_rejects_workers_that_do_not_split_over_nodes():
    recipe = load_recipe(AMD)
    uneven = recipe.model_copy(update={"actor": recipe.actor.model_copy(update={"num_workers": 12, "nodes": 5})})
    with pytest.raises(PlacementError, match="actor.num_workers: 12 workers do not split evenly over actor.nodes=5"):
        plan_placement(uneven)



ONE_GPU = ["cluster.accelerator=cuda", "cluster.gpus_per_node=1", "cluster.colocate=gpu", "actor.backend=megatron",
           "actor.model_provider=repro.train.megatron.qwen3:provider", "rollout.backend=vllm"]


def test_a_one_gpu_box_shares_its_gpu_half_and_half_and_syncs_over_gloo():
    from repro.sync.bucket_wire import sync_backend
    from repro.rollout.vllm_args import uses_vllm_transfer

    recipe = load_recipe(TINY, ONE_GPU)
    plan = plan_placement(recipe)
    assert plan.group(TRAINER).bundles == ({"GPU": 0.5, "CPU": 4},)
    assert plan.group(ROLLOUT).bundles == ({"GPU": 0.5, "CPU": 8},) and plan.group(ROLLOUT).avoid_groups == ()
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): repro's stream over gloo, no vLLM engine
    assert sync_backend(recipe) == "gloo" and not uses_vllm_transfer(recipe)
    beside = load_recipe(TINY, [*ONE_GPU, "cluster.gpus_per_node=2", "cluster.colocate=node"])
    assert plan_placement(beside).group(ROLLOUT).bundles == ({"GPU": 1, "CPU": 8},)
    assert sync_backend(beside) == "nccl" and sync_backend(load_recipe(AMD)) == "nccl"


@pytest.mark.parametrize("extra, says", [
    (["actor.num_workers=2"], "cluster.colocate='gpu': one trainer worker and a TP-1 rollout share one GPU"),
    (["cluster.num_nodes=2"], "cluster.colocate='gpu': one node"),
    (["cluster.colocate=node"], "cluster.colocate='node': 1 trainer GPU\\(s\\) \\+ rollout TP=1 exceed"),
])
def test_colocated_layouts_that_do_not_fit_are_named(extra, says):
    with pytest.raises(Exception, match=says):
        load_recipe(TINY, [*ONE_GPU, *extra])

def test_joining_an_unreachable_address_names_it_quickly():
    from repro.cluster.runtime import ensure_ray

    recipe = load_recipe(AMD, overrides=["cluster.ray_address=127.0.0.1:1"])
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"could not join the Ray cluster at '127.0.0.1:1'"):
        ensure_ray(recipe)
    assert time.monotonic() - started < 10


# -- (b, c) the AMD layout on a simulated 3-node cluster with logical GPUs ---------------------------------
class TestSimulatedAmdCluster:
    @pytest.fixture(scope="class")
    def amd_cluster(self):
        import ray
        from ray.cluster_utils import Cluster

        from repro.cluster.runtime import ensure_ray, shutdown_ray

        # no log monitor (log_to_driver is off anyway) and no autoscaler monitor: 4 fewer Python processes
        lean = {"include_log_monitor": False}
        started = time.perf_counter()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 40, "num_gpus": 8, "include_dashboard": False, "no_monitor": True, **lean})
        for _ in range(2):
            cluster.add_node(num_cpus=40, num_gpus=8, **lean)
        recipe = load_recipe(AMD, overrides=[f"cluster.ray_address={cluster.address}"])
        try:
            info = ensure_ray(recipe)
            print(f"\nsimulated 3-node cluster up and joined in {time.perf_counter() - started:.1f} s")
            assert not info.started_local
            yield recipe
        finally:
            shutdown_ray()
            cluster.shutdown()
            assert not ray.is_initialized()

    def test_amd_layout_puts_trainer_on_two_full_nodes_and_rollout_on_the_third(self, amd_cluster):
        import ray

        assert ray.cluster_resources()["GPU"] == 24
        placed = create_placement_groups(plan_placement(amd_cluster), timeout_s=60)
        try:
            rows = placement_table(placed)
            print("\n" + format_placement_table(rows))
            trainer_nodes = [r.node_id for r in rows if r.group == TRAINER]
            rollout_nodes = {r.node_id for r in rows if r.group == ROLLOUT}
            assert len(trainer_nodes) == 16
            assert sorted(trainer_nodes.count(n) for n in set(trainer_nodes)) == [8, 8]
            assert len(rollout_nodes) == 1 and not rollout_nodes & set(trainer_nodes)
            # ranks 0-7 share a node, 8-15 share the other: Megatron's TP groups stay inside a node
            assert len(set(trainer_nodes[:8])) == 1 and len(set(trainer_nodes[8:])) == 1
            assert [r.resources for r in rows if r.group == ROLLOUT] == [{"GPU": 8.0, "CPU": 8.0}]
        finally:
            placed.remove()

    def test_half_size_slices_stay_apart_when_capacity_alone_would_let_them_share(self, amd_cluster):
        # 4-GPU trainer slices and a TP4 rollout: two slices fit on one node, and something else already
        # holds 4 GPUs on two nodes, so only the node-id selectors keep the three apart.
        from ray.util.placement_group import placement_group, remove_placement_group

        blocker = placement_group([{"GPU": 4}] * 2, strategy="STRICT_SPREAD")
        assert blocker.wait(30)
        half = load_recipe(AMD, overrides=[f"cluster.ray_address={amd_cluster.cluster.ray_address}",
                                           "actor.num_workers=8", "actor.tensor_parallel=2", "actor.expert_parallel=2",
                                           "rollout.tensor_parallel=4"])
        placed = create_placement_groups(plan_placement(half), timeout_s=30)
        try:
            rows = placement_table(placed)
            trainer = [r.node_id for r in rows if r.group == TRAINER]
            rollout = {r.node_id for r in rows if r.group == ROLLOUT}
            assert len(set(trainer[:4])) == len(set(trainer[4:])) == 1 and trainer[0] != trainer[4]
            assert len(rollout) == 1 and not rollout & set(trainer)
        finally:
            placed.remove()
            remove_placement_group(blocker)

    def test_unplaceable_trainer_fails_within_timeout_naming_group_and_resources(self, amd_cluster):
        import ray

        plan = plan_placement(amd_cluster)
        trainer = dataclasses.replace(
            plan.group(TRAINER), bundles=tuple({"GPU": 1, "CPU": 4} for _ in range(32)), bundles_per_slice=16
        )
        too_big = dataclasses.replace(plan, groups=(trainer, plan.group(ROLLOUT)))
        started = time.monotonic()
        with pytest.raises(PlacementError) as caught:
            create_placement_groups(too_big, timeout_s=3)
        assert time.monotonic() - started < 15
        message = str(caught.value)
        assert message.startswith("trainer group could not be placed within 3 s: slice 1 of 2")
        assert "16 bundle(s) of {'GPU': 1, 'CPU': 4} STRICT_PACK" in message
        assert "asks 32 bundles (GPU: 32, CPU: 128)" in message
        assert "ray.cluster_resources() offers {GPU: 24, CPU: 120}" in message
        deadline = time.monotonic() + 10  # the failed slice is removed: every GPU is free again
        while ray.available_resources().get("GPU", 0) < 24 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("GPU", 0) == 24

    def test_each_actor_sees_only_its_own_gpus_and_picks_a_device_that_exists(self, amd_cluster):
        """Ray's own GPU isolation on logical GPUs: a trainer rank's actor (``num_gpus=1``) sees one GPU, whatever its
        LOCAL_RANK; the rollout actor owns a {GPU: 8} bundle and its placement group is visible inside it -- the one
        vLLM's Ray executor would take and refuse. STAND-IN: GPUs are Ray's logical resources (torch sees none), so
        the device count is the number of ids Ray left visible; vLLM itself is the vLLM lane's test."""
        import ray
        import ray.cloudpickle

        from repro.groups.ray_actors import start_actor, stop_actors
        from repro.groups.ray_groups import rank_env
        from repro.rollout.vllm_args import engine_args_from_recipe

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        placed = create_placement_groups(plan_placement(amd_cluster), timeout_s=60)
        actors = []
        try:
            actors = [start_actor(placed, TRAINER, rank, Probe, env=rank_env(rank, 16, 8, ("127.0.0.1", 29500)))
                      for rank in (1, 9)] + [start_actor(placed, ROLLOUT, 0, Probe)]
            (rank1, rank9, rollout) = ray.get([a.look.remote() for a in actors], timeout=120)
        finally:
            stop_actors(actors)
            placed.remove()
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        for seen, local in ((rank1, "1"), (rank9, "1")):
            assert seen["LOCAL_RANK"] == local and len(seen["visible"]) == 1 and seen["gpu_ids"] == seen["visible"]
            assert seen["device_index"] == 0  # what init_distributed_from_env now sets
            assert seen["old_rule_valid"] is False  # LOCAL_RANK as the index: "invalid device ordinal" on a GPU
        assert len(rollout["visible"]) == 8 and rollout["bundles"] == [{"GPU": 8.0, "CPU": 8.0}]
        # vLLM's Ray executor refuses any bundle with more than one GPU; repro asks for its multiprocessing workers
        assert max(b["GPU"] for b in rollout["bundles"]) > 1
        assert engine_args_from_recipe(amd_cluster, "/models/dsv4")["distributed_executor_backend"] == "mp"



class Probe:
    """What a worker actor sees of its GPUs and placement (test_each_actor_sees_only_its_own_gpus...)."""

    def look(self):
        import os

        import ray

        from repro.devices import DeviceError, local_device_index, ray_assigned_gpus, visible_devices

        visible = visible_devices(os.environ) or []
        try:
            index = local_device_index(os.environ, ray_assigned_gpus(), device_count=len(visible))
        except DeviceError as err:
            index = str(err)
        group = ray.util.get_current_placement_group()
        return {"LOCAL_RANK": os.environ.get("LOCAL_RANK"), "visible": visible, "device_index": index,
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                "old_rule_valid": int(os.environ.get("LOCAL_RANK", "0")) < len(visible),
                "bundles": group.bundle_specs if group else None}


class SyncProbe:
    """A trainer rank and a rollout worker reduced to their sync calls: each address is new (a fresh port), the
    rollout fails sync v1 and answers the port it received from otherwise."""

    def __init__(self):
        self.ports = iter(range(40000, 41000))

    def sync_address(self):
        from repro.sync.group import SyncAddress

        return SyncAddress("127.0.0.1", next(self.ports), sender=0, receivers=1)

    def broadcast_weights(self, version, address):
        return 0

    def receive_weights(self, source, version):
        if version == 1:
            raise RuntimeError(f"weight sync v{version} failed half-way")
        return source.addresses[0].port

# -- (d, e) the tiny recipe on a local instance ------------------------------------------------------------
class Echo:
    """A stand-in worker: cheap to build, says where it runs, and serves generate() like a rollout worker."""

    def __init__(self, tag):
        self.tag = tag

    def add(self, a, b):
        return f"{self.tag}:{a + b}"

    def where(self):
        from repro.groups.ray_actors import where_am_i

        return {"tag": self.tag, **where_am_i()}

    def generate(self, prompts, params):
        raise ValueError(f"{self.tag} cannot generate {len(prompts)} prompts")


class TestLocalTinyInstance:
    @pytest.fixture(scope="class")
    def tiny_placed(self):
        import ray
        import ray.cloudpickle

        from repro.cluster.runtime import ensure_ray, shutdown_ray

        # Echo lives in this test module, which Ray's workers cannot import: ship it by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        recipe = load_recipe(TINY)
        try:
            info = ensure_ray(recipe)
            print(f"\nlocal Ray instance for {TINY} started in {info.connect_s:.1f} s")
            assert info.started_local and info.num_cpus == 2 and info.num_gpus == 0
            assert ensure_ray(recipe) is info  # idempotent
            placed = create_placement_groups(plan_placement(recipe), timeout_s=60)
            yield placed
        finally:
            shutdown_ray()
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
            assert not ray.is_initialized()

    def test_an_actor_in_each_bundle_answers(self, tiny_placed):
        import ray

        from repro.groups.ray_actors import start_actor, stop_actors

        actors = [start_actor(tiny_placed, g, 0, Echo, (g,)) for g in (TRAINER, ROLLOUT)]
        try:
            assert ray.get([a.add.remote(2, 3) for a in actors], timeout=60) == ["trainer:5", "rollout:5"]
            where = ray.get([a.where.remote() for a in actors], timeout=60)
            assert [w["tag"] for w in where] == ["trainer", "rollout"] and all(w["pid"] > 0 for w in where)
        finally:
            stop_actors(actors)

    def test_a_failing_or_killed_worker_raises_an_error_naming_it_and_the_call(self, tiny_placed):
        import ray

        from repro.groups.ray_actors import WorkerDiedError, start_actor
        from repro.groups.ray_groups import RayRolloutGroup

        rollout = RayRolloutGroup(start_actor(tiny_placed, ROLLOUT, 0, Echo, ("rollout",)), timeout_s=60)
        with pytest.raises(WorkerDiedError,
                           match=r"^rollout worker 0 failed during generate: .*rollout cannot generate 1 prompts"):
            rollout.generate([[1, 2]], None)
        ray.kill(rollout.actor, no_restart=True)
        _wait_until_dead(rollout.actor)  # ray.kill is asynchronous: a call right after it may still be served
        with pytest.raises(WorkerDiedError, match=r"^rollout worker 0 died during generate: "):
            rollout.generate([[1, 2]], None)


    def test_after_a_failed_sync_both_ends_form_new_groups_at_new_addresses(self, tiny_placed):
        """A receiver that failed may have left its group half-used; re-joining the old address would wait for a
        sender that never returns. The driver hands every rank a new address after a failure."""
        from repro.groups.ray_actors import WorkerDiedError, start_actor, stop_actors
        from repro.groups.ray_groups import RayRolloutGroup, RayTrainerGroup

        trainer = RayTrainerGroup([start_actor(tiny_placed, TRAINER, 0, SyncProbe)], timeout_s=60)
        rollout = RayRolloutGroup(start_actor(tiny_placed, ROLLOUT, 0, SyncProbe), timeout_s=60)
        try:
            first = trainer.send_weights(1)
            with pytest.raises(WorkerDiedError, match="rollout worker 0 failed during weight sync: .*v1 failed"):
                rollout.receive_weights(first, 1)
            second = trainer.send_weights(2)
            assert rollout.receive_weights(second, 2) == second.source.addresses[0].port
            assert second.source != first.source  # before: the same address, the old group
            third = trainer.send_weights(3)  # after a success the groups are kept
            assert third.source == second.source and \
                rollout.receive_weights(third, 3) == second.source.addresses[0].port
        finally:
            stop_actors([*trainer.ranks, rollout.actor])

def _wait_until_dead(actor, timeout_s: float = 60.0) -> None:
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.where.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.2)
    raise AssertionError(f"the actor still answers {timeout_s:g} s after ray.kill")


def test_cpu_workers_sleep_their_idle_threads_only_when_they_have_several(monkeypatch):
    from repro.groups.ray_groups import cpu_worker_env
    from repro.train import threads

    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert cpu_worker_env(1) == {"OMP_NUM_THREADS": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
    assert cpu_worker_env(2) == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE",
                                 "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
