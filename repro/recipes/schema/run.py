"""What keeps and records the run, and the other engines' settings: checkpoints, weight sync, tracking, LumenRL,
verl."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from repro.recipes.schema.section import Section


class CheckpointConfig(Section):
    every_steps: int = Field(25, ge=1, description="Save trainer state after every this many steps.")
    keep_last: int = Field(2, ge=1, description="Complete checkpoints kept; older ones are deleted.")
    max_restarts: int = Field(
        0, ge=0, description="repro run --max-restarts: when a worker dies, end both groups, start new ones and "
        "resume from the newest complete checkpoint, at most this many times per call (each a 'restart' row in "
        "metrics.jsonl); the same worker dying in the same call at the same step again stops the run. 0: stop at the "
        "first death, as LumenRL and verl do.")


class WeightSyncConfig(Section):
    transport: Literal["rdma", "ray_object_store"] = Field(
        "rdma", description="LumenRL's weight_sync.backend (AMD: RDMA over RCCL). repro's own engine always streams "
        "over a collective group made for the sync (gloo on CPU, NCCL/RCCL on GPUs), whatever this says.")
    bucket_mb: int = Field(2048, ge=1, description="Bucket size in MB for streaming named tensors.")
    quantize_on: Literal["rollout", "trainer"] = Field(
        "rollout", description="Where BF16 becomes FP8 (AMD: on the rollout side).")
    timeout_s: float = Field(
        7200.0, gt=0, description="Abort a sync that takes longer than this (LumenRL's longrun file: 7200 s; its "
        "header comment still says 1200 s).")
    vllm_engine: bool = Field(
        True, description="engine repro: where the rollout is vLLM on GPUs and one trainer rank sends (no pipeline "
        "stages), sync through vLLM's own weight-transfer engine (weight_transfer_config backend nccl; packed buckets "
        "of bucket_mb, double-buffered on the device); false, on CPU, or with one sender per pipeline stage: repro's "
        "own stream (repro.sync).")


class WandbTracking(Section):
    """W&B, fed the rows of metrics.jsonl as they are written (engine lumenrl: LumenRL's own W&B logger instead)."""

    enabled: bool = Field(
        False, description="Log the run to W&B: keys = the metrics.jsonl keys, step = the optimizer step, evaluations "
        "at their steps, config = the resolved recipe; the run id is kept in <run_dir>/wandb/run_id so a resumed run "
        "continues it.")
    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: W&B's files only, under <run_dir>/wandb (upload later with `wandb sync`); "
        "online: streamed, after `wandb login`.")
    project: str = Field("repro", description="W&B project (AMD logged LumenRL's run to project LumenRL).")
    entity: str | None = Field(None, description="W&B entity (user or team); null: the logged-in user's default.")
    name: str | None = Field(
        None, description="W&B run name; null: the run directory's name (engine lumenrl: LumenRL's own default).")


class TrackingConfig(Section):
    """What a run records besides metrics.jsonl, eval/ and its checkpoints; none of it changes the run."""

    wandb: WandbTracking = Field(
        default_factory=WandbTracking, description="Weights & Biases (needs `pip install 'repro[wandb]'`).")
    tensorboard: bool = Field(
        False, description="Write TensorBoard event files under <run_dir>/tensorboard from the rows of metrics.jsonl "
        "(needs `pip install 'repro[tensorboard]'`); `tensorboard --logdir <run_dir>/tensorboard`.")
    rollouts: bool = Field(
        True, description="Write every step's trajectories (prompt, response, reward, advantage, log-prob sums, "
        "largest rollout/trainer gap, share above the TIS cap) to <run_dir>/rollouts/step_NNNNNN.jsonl.gz; `repro "
        "rollouts RUN --step N` prints them. engine lumenrl: not written (LumenRL's rollouts stay in its process).")


class LumenRLSettings(Section):
    """Where AMD's LumenRL lives and the site settings its config needs; used when ``engine`` is lumenrl."""

    path: str | None = Field(
        None, description="LumenRL checkout (Lumen-RL, branch dev/dsv4-grpo) on the Ray head; required for engine "
        "lumenrl (run_grpo_dsv4.sh: $RL_ROOT/Lumen-RL).")
    lumen_path: str | None = Field(
        None, description="Lumen checkout put on PYTHONPATH beside LumenRL; null: $RL_ROOT/Lumen next to the "
        "checkout, else its third_party/Lumen.")
    base_config: str = Field(
        "examples/GRPO/configs/grpo_dsv4_flash_vllm_longrun.yaml", description="Published config the written one "
        "starts from (relative to path); every key the recipe determines is replaced.")
    checkpoint_dir: str | None = Field(
        None, description="LumenRL's checkpointing.checkpoint_dir (global_step_N/), the same path on every trainer "
        "node; null: <run_dir>/checkpoints.")
    actor_node_ips: str | None = Field(
        None, description="Comma-separated IPs that pin LumenRL's trainer workers (topology_tags.node_ips); null: "
        "unpinned (the published file pins AMD's machines).")
    rollout_node_ips: str | None = Field(
        None, description="Comma-separated IPs that pin LumenRL's rollout workers; null: unpinned.")
    overrides: list[str] = Field(
        default_factory=list, description="LumenRL 'dotted.key=value' overrides appended to its command line (e.g. "
        "weight_sync.rdma.interface=ens14np0).")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for LumenRL over run_grpo_dsv4.sh's (e.g. NCCL_SOCKET_IFNAME, "
        "NCCL_IB_HCA, GLOO_SOCKET_IFNAME for your NICs).")
    ray_stop_first: bool = Field(
        False, description="Run `ray stop --force` on this node before starting, as run_grpo_dsv4.sh does unless "
        "LUMENRL_KEEP_RAY_CLUSTER=1; false keeps the cluster `ray start` built.")


_TRANSFORMER = "++actor_rollout_ref.actor.megatron.override_transformer_config."
DSV4_ON_MEGATRON_BRIDGE = (_TRANSFORMER + "apply_dsa_kernel_fusion=True",
                           _TRANSFORMER + "dsa_indexer_use_sparse_loss=True",
                           _TRANSFORMER + "dsa_indexer_loss_coeff=0.0", _TRANSFORMER + "use_fused_mhc=False")


class VerlSettings(Section):
    """verl as the engine (``engine: verl``, verl 0.9.1): where it is installed, where its files go, site settings."""

    python: str | None = Field(
        None, description="Interpreter with verl[verl-core]==0.9.1 (the image's Python, where repro is installed "
        "too); null: this one.")
    image: str | None = Field(
        None, description="The container image verl runs in, for the record and the dry run (NVIDIA: verl's vLLM "
        "image; ROCm: verl's docker/rocm/Dockerfile.rocm.deepseek-v4); nothing is pulled.")
    nodes: int | None = Field(
        None, ge=1, description="Nodes verl's synchronous trainer spans, rollout colocated on the same GPUs "
        "(trainer.nnodes); null: actor.nodes, so the trainer's parallel layout is the recipe's.")
    checkpoint_dir: str | None = Field(
        None, description="trainer.default_local_dir (global_step_N/), the same path on every node; null: "
        "<run_dir>/checkpoints.")
    data_dir: str | None = Field(
        None, description="Where the train/val parquet files in verl's layout are written (read by verl's TaskRunner, "
        "on any node); null: <run_dir>/verl/data.")
    reward_function: str | None = Field(
        None, description="File whose compute_score verl calls (reward.custom_reward_function.path); null: repro's "
        "DAPO rule with the recipe's reward settings (repro/verl/reward_fn.py).")
    overrides: list[str] = Field(
        default_factory=lambda: list(DSV4_ON_MEGATRON_BRIDGE), description="Hydra overrides appended after the "
        "written ones (e.g. actor_rollout_ref.nccl_timeout=3600); composed and checked with them. Default: "
        "DeepSeek-V4's Megatron-Bridge settings as verl's published DSV4 script sets them (the sparse-attention "
        "indexer with its fused kernel and no loss of its own, the fused hyper-connection kernel off); another model: "
        "[].")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for verl's driver and, through "
        "+ray_kwargs.ray_init.runtime_env.env_vars, its Ray workers (e.g. NCCL_SOCKET_IFNAME).")
