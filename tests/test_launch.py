"""repro launch: Megatron's rank -> (tp, cp, dp, pp, ep) mapping, the dry run on a simulated 3 x 8-GPU cluster
(placement printed, nothing started, nothing left reserved), and the named refusal when backends are missing.

One module-scoped simulated cluster (~15-25 s to start on 2 busy cores), shut down with the module.
"""

import argparse
import os
import re
import time

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

import pytest  # noqa: E402

from repro.recipes import load_recipe  # noqa: E402
from repro.run.launch import (  # noqa: E402
    LaunchError,
    launch_blockers,
    megatron_coords,
    missing_backends,
    parallel_sizes,
    trainer_worker_args,
)

AMD = "amd-dsv4-flash-mi308x"


def _launch(argv):
    from repro.commands import launch

    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return launch.run(parser.parse_args(argv))


# -- the pure rank mapping -----------------------------------------------------------------------------------
def test_tp4_pp4_ep4_on_16_ranks_is_megatron_default_order():
    sizes = parallel_sizes(16, tp=4, pp=4, ep=4, etp=1)
    assert (sizes.dp, sizes.edp, sizes.cp) == (1, 1, 1)
    got = [(c.tp, c.pp, c.dp, c.ep) for c in (megatron_coords(r, sizes) for r in range(16))]
    # tp fastest, then (cp, dp of size 1), pp slowest; experts: etp=1, ep fastest, pp slowest
    assert got == [(r % 4, r // 4, 0, r % 4) for r in range(16)]
    assert got[:6] == [(0, 0, 0, 0), (1, 0, 0, 1), (2, 0, 0, 2), (3, 0, 0, 3), (0, 1, 0, 0), (1, 1, 0, 1)]
    assert got[15] == (3, 3, 0, 3)
    assert all(megatron_coords(r, sizes).etp == 0 for r in range(16))


def test_mapping_with_data_parallel_and_default_expert_tp():
    # 32 ranks, TP2 PP2 -> DP 8; EP4 with ETP defaulting to TP (2) -> EDP 2: expert dims differ from dense ones
    sizes = parallel_sizes(32, tp=2, pp=2, ep=4)
    assert (sizes.dp, sizes.etp, sizes.edp) == (8, 2, 2)
    c = megatron_coords(13, sizes)  # 13 = 1 + 2*(6 + 8*0)  and  1 + 2*(2 + 4*(1 + 2*0))
    assert (c.tp, c.dp, c.pp) == (1, 6, 0) and (c.etp, c.ep, c.edp) == (1, 2, 1)
    c = megatron_coords(31, sizes)
    assert (c.tp, c.dp, c.pp, c.etp, c.ep, c.edp) == (1, 7, 1, 1, 3, 1)


def test_layouts_that_do_not_divide_are_named():
    with pytest.raises(LaunchError, match=r"16 trainer ranks are not divisible by "
                                          r"tensor_parallel \* context_parallel \* pipeline_parallel = 12"):
        parallel_sizes(16, tp=4, pp=3)
    with pytest.raises(LaunchError, match="expert_tensor_parallel \\* expert_parallel \\* pipeline_parallel = 32"):
        parallel_sizes(16, tp=4, pp=4, ep=8, etp=1)
    with pytest.raises(LaunchError, match="rank 16 outside 0..15"):
        megatron_coords(16, parallel_sizes(16, tp=4, pp=4, ep=4, etp=1))


def test_worker_arguments_follow_the_recipe():
    args = trainer_worker_args(load_recipe(AMD), master_addr="10.0.0.1")
    assert [a["local_rank"] for a in args] == list(range(8)) * 2 and \
        [a["trainer_node"] for a in args] == [0] * 8 + [1] * 8
    assert {a["world_size"] for a in args} == {16} and {a["master_addr"] for a in args} == {"10.0.0.1"}


def printed_sections(text: str) -> dict[str, dict[str, str]]:
    """The dry run's argument sections as {title: {name: printed repr}}."""
    sections, title = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = {}
        elif title and line.startswith("  ") and " = " in line:
            name, value = line.strip().split(" = ", 1)
            sections[title][name] = value
        elif not line.strip():
            title = None
    return sections


@pytest.mark.parametrize("recipe_name", ["amd-dsv4-flash-mi308x", "tiny-cpu"])
def test_the_dry_run_prints_exactly_the_arguments_the_workers_are_built_with(recipe_name, monkeypatch):
    """The printed vLLM and Megatron arguments equal what the engine and the trainer ranks receive: vLLM's LLM
    is a stand-in class here that records its keyword arguments (vLLM is not installed in this venv), and
    VLLMEngine.from_recipe is the real constructor path; Megatron's come from megatron_layout, which
    MegatronTrainer.from_recipe and the model providers call (the Megatron lane builds a trainer from them)."""
    import sys
    import types

    from repro.cluster.placement import plan_placement
    from repro.rollout import vllm_engine
    from repro.run.launch import format_dry_run, unplaced_rows
    from repro.train.megatron.config import megatron_layout

    on_cluster = ["rollout.backend=vllm", "actor.backend=megatron"] if recipe_name == "tiny-cpu" else []
    recipe = load_recipe(recipe_name, on_cluster)
    printed = printed_sections(format_dry_run(recipe, plan_placement(recipe), unplaced_rows(plan_placement(recipe))))
    for section, values in megatron_layout(recipe).items():
        assert printed[f"megatron {section}"] == {k: repr(v) for k, v in values.items()}

    built = {}

    class StandInLLM:  # records what the engine passes; generates nothing
        def __init__(self, **kwargs):
            built.update(kwargs)

        def collective_rpc(self, name):
            return [[]]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=StandInLLM))
    monkeypatch.setattr(vllm_engine, "check_servable", lambda model_dir, arch: None)  # no checkpoint folder here
    monkeypatch.setattr(vllm_engine, "served_from_folder", lambda model_dir: None)
    vllm_engine.VLLMEngine.from_recipe(recipe, recipe.model.path, eos_id=1)
    assert printed["vllm.LLM"] == {k: repr(v) for k, v in built.items()}
    assert printed["vllm.LLM"]["model"] == repr(recipe.model.path)


def test_launch_without_backends_stops_naming_them(monkeypatch):
    import repro.run.launch as launch_module

    monkeypatch.setattr(launch_module, "module_available", lambda name: False)
    # megatron-core, vLLM, and Transformer Engine: AMD's offloaded BF16-moment optimizer is megatron's precision-aware
    # path, which megatron-core 0.16.1 cannot configure without TE
    assert len(missing_backends(load_recipe(AMD))) == 3
    assert missing_backends(load_recipe("tiny-cpu")) == []  # embedded backends: nothing to find
    with pytest.raises(LaunchError, match=r"missing megatron-core, the Megatron trainer backend's library "
                                          r".*module megatron.core.*"
                                          r"missing vLLM, the rollout engine's library .*module vllm.*"
                                          r"missing Transformer Engine, .*precision-aware optimizer.*"
                                          r"module transformer_engine"):
        _launch(["--recipe", AMD])
    no_te = ["actor.optimizer_cpu_offload=false", "actor.optimizer_moment_dtype=fp32"]
    assert len(missing_backends(load_recipe(AMD, no_te))) == 2


def test_module_available_answers_for_submodules_of_absent_packages():
    from repro.run.launch import module_available

    assert module_available("json.decoder") and not module_available("no_such_package.core")


def test_launch_with_backends_but_no_dsv4_model_provider_names_the_field(monkeypatch):
    import repro.run.launch as launch_module

    monkeypatch.setattr(launch_module, "module_available", lambda name: True)
    assert missing_backends(load_recipe(AMD)) == []
    with pytest.raises(LaunchError, match=r"^recipe amd-dsv4-flash-mi308x cannot be launched from here: "
                                          r"actor.model_provider is not set: megatron-core has no DeepSeek-V4 layers"):
        _launch(["--recipe", AMD])
    assert launch_blockers(load_recipe(AMD, ["actor.model_provider=lumenrl.models:dsv4_provider"])) == []
    assert launch_blockers(load_recipe(AMD, ["rollout.num_replicas=2", "cluster.num_nodes=4",
                                             "actor.model_provider=m:f"])) == [
        "rollout.num_replicas=2: one rollout replica is started"]


def test_dry_run_without_a_cluster_prints_the_unplaced_plan_and_fails(capsys):
    from repro.cluster import ClusterError

    with pytest.raises(ClusterError, match="dry run: the plan above could not be placed: "
                                           ".*could not join the Ray cluster at '127.0.0.1:1'") as err:
        _launch(["--recipe", AMD, "--dry-run", "--set", "cluster.ray_address=127.0.0.1:1"])
    out = capsys.readouterr().out
    assert out.count("(not placed)") == 17 and "tensor_parallel_size = 8" in out and "--simulate" in str(err)


# -- the dry run on a simulated 3-node cluster ----------------------------------------------------------------
@pytest.fixture(scope="module")
def simulated_cluster():
    import ray
    from ray.cluster_utils import Cluster

    lean = {"include_log_monitor": False}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 40, "num_gpus": 8, "include_dashboard": False, "no_monitor": True, **lean})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=40, num_gpus=8, **lean)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


ROW = re.compile(r"^(trainer|rollout) worker\s+(\d+)\s+(\d+)\s+(\d+)\s+([A-Z]) (\w+)\s+\S+\s+GPU (\d+), CPU (\d+)(.*)$")


def test_dry_run_places_16_trainer_ranks_on_two_nodes_and_the_rollout_on_the_third(simulated_cluster, capsys):
    import ray

    started = time.perf_counter()
    assert _launch(["--recipe", AMD, "--dry-run", "--set", f"cluster.ray_address={simulated_cluster.address}",
                    "--placement-timeout", "60"]) == 0
    out = capsys.readouterr().out
    print(f"\n{out}\n(dry run took {time.perf_counter() - started:.1f} s)")
    rows = [ROW.match(line) for line in out.splitlines() if ROW.match(line)]
    trainer = [m for m in rows if m.group(1) == "trainer"]
    rollout = [m for m in rows if m.group(1) == "rollout"]
    assert len(trainer) == 16 and len(rollout) == 1
    assert [int(m.group(2)) for m in trainer] == list(range(16))
    trainer_nodes = [m.group(5) for m in trainer]
    assert trainer_nodes == ["A"] * 8 + ["B"] * 8  # ranks 0-7 on one node, 8-15 on another
    assert rollout[0].group(5) == "C" and (rollout[0].group(7), rollout[0].group(8)) == ("8", "8")
    assert all((m.group(7), m.group(8)) == ("1", "4") for m in trainer)
    # Megatron coordinates of rank 13: local rank 5, tp 1, cp 0, dp 0, pp 3, ep 1, etp 0, edp 0
    assert trainer[13].group(9).split() == ["13", "5", "1", "0", "0", "3", "1", "0", "0"]
    assert "MASTER_ADDR " in out and "<node of rank 0>" not in out
    assert "tensor_parallel_size = 8" in out and "nothing is started" in out

    # nothing was started and nothing stays reserved; the command closed its own connection
    assert not ray.is_initialized()
    with capsys.disabled():  # Ray's log handler must not write into the capture closed above
        ray.init(address=simulated_cluster.address, log_to_driver=False, logging_level="warning")
    try:
        from ray._private.state import actors

        assert actors() == {}
        deadline = time.monotonic() + 20
        while ray.available_resources().get("GPU", 0) < 24 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("GPU", 0) == 24
    finally:
        ray.shutdown()


def test_a_dry_run_with_no_cluster_to_join_shows_the_placement_on_a_simulated_one(capsys, monkeypatch):
    """The README's `repro launch --dry-run` on a machine without the cluster: no "(not placed)" rows and no
    failure, but the placement on a simulated cluster of the recipe's shape, said plainly to be simulated."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    from repro.readiness import facts

    def nothing_recorded(address):  # as on a machine where `ray start` never ran
        raise facts.NoClusterFound("no Ray cluster found on this machine (test: nothing recorded)")

    monkeypatch.setattr(facts, "resolve_address", nothing_recorded)
    assert _launch(["--recipe", AMD, "--dry-run", "--placement-timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "no Ray cluster found" in out and out.count("SIMULATED: no Ray cluster was used") == 1
    rows = [ROW.match(line) for line in out.splitlines() if ROW.match(line)]
    assert [m.group(5) for m in rows] == ["A"] * 8 + ["B"] * 8 + ["C"] and "(not placed)" not in out
    assert not ray.is_initialized()
