"""Where the run is placed and what it trains: the cluster, its software, the model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from repro.recipes.schema.section import Section


class ClusterVersions(Section):
    """What the cluster's images run; `repro check` compares this host against it (null: any version, reported)."""

    python: str | None = Field(
        "3.12", description="Python of the images (AMD: vllm/vllm-openai-rocm:v0.25.1, Python 3.12); Ray needs one "
        "minor version on every node and the driver.")
    torch: str | None = Field(
        "2.11.0", description="torch version, compared without its +local tag (AMD's image: the ROCm build "
        "2.11.0+gitd0c8b1f).")
    rocm: str | None = Field(
        "7.2", description="ROCm release, compared by prefix (AMD: ROCm 7.2); null on CUDA or CPU.")
    vllm: str | None = Field(
        "0.25.1", description="vLLM version the rollout runs (AMD: 0.25.1); checked when rollout.backend is vllm.")
    ray: str | None = Field(
        "2.56.1", description="Ray version on every node (LumenRL's Dockerfile.dsv4 installs ray[default]==2.56.1); "
        "nodes of other versions cannot join.")
    transformers: str | None = Field(
        "5.13.1", description="transformers in the images (vLLM 0.25.1's ROCm image; LumenRL's `transformers>=5.0` "
        "keeps it).")
    megatron_core: str | None = Field(
        None, description="megatron-core version the trainer needs; null: any (AMD ran ROCm/Megatron-LM rocm_dev with "
        "a DSV4 patch, no release number).")
    lumenrl: str | None = Field(
        None, description="LumenRL commit (or its first characters) the run expects; null: any commit, reported by "
        "`repro check`.")


class ClusterConfig(Section):
    num_nodes: int = Field(3, ge=1, description="Ray nodes the run spans (AMD: 3 servers).")
    gpus_per_node: int = Field(8, ge=0, description="Accelerators per node; 0 means CPU mode (the tiny recipe).")
    accelerator: Literal["rocm", "cuda", "cpu"] = Field(
        "rocm", description="Accelerator the recipe expects (AMD: ROCm 7.2, MI308X gfx942).")
    device_memory_gb: float = Field(
        192.0, gt=0, description="Memory of one accelerator in GB (MI308X: 192 GB HBM3); the dry run's memory budget "
        "judges each trainer rank against it.")
    host_memory_gb: float | None = Field(
        None, gt=0, description="Host RAM of one node in GB, for the dry run's budget of the offloaded optimizer; "
        "null: unknown (AMD does not state it; `repro check` measures it).")
    ray_address: str | None = Field(
        "auto", description="Ray cluster to join; 'auto' finds a running one, null starts a local instance.")
    colocate: Literal["none", "node", "gpu"] = Field(
        "none", description="Where the rollout may run: 'none' on nodes without trainer ranks (AMD); 'node' beside "
        "them on their node's free GPUs (a one-node box); 'gpu' sharing their GPU, half each (a one-GPU smoke test: "
        "its weight sync goes over gloo, since NCCL cannot put two ranks on one GPU).")
    versions: ClusterVersions = Field(
        default_factory=ClusterVersions, description="Software the cluster runs; `repro check` compares against it.")
    cpu_threads_per_worker: int = Field(
        1, ge=1, description="CPU mode: torch threads of each Ray worker. The loop runs one phase at a time, so the "
        "running worker may use every core; above 1 idle threads sleep (OMP_WAIT_POLICY=PASSIVE) instead of spinning "
        "against the other worker.")


class ModelConfig(Section):
    name: str = Field(
        "RedHatAI/DeepSeek-V4-Flash-BF16", description="Hub id of the BF16 weights, for the record: nothing is "
        "downloaded at run time.")
    path: str = Field(
        "/dev/shm/models/DeepSeek-V4-Flash-BF16", description="Local HF-layout BF16 checkpoint folder; "
        "'builtin:tiny-dsv4-warm' is the shipped tiny model.")
    num_parameters: int = Field(
        284_000_000_000, ge=1, description="Total parameters, used to size checkpoints and offloaded optimizer state.")
    num_active_parameters: int = Field(
        13_000_000_000, ge=1, description="Parameters active per token (MoE), for FLOP estimates.")
    num_routed_experts: int = Field(
        256, ge=1, description="Routed experts per MoE layer; expert parallelism must divide it.")
    num_experts_per_tok: int = Field(6, ge=1, description="Experts each token is routed to (top-k).")
    num_layers: int = Field(
        43, ge=1, description="Transformer layers the trainer holds and pipeline stages split (DeepSeek-V4-Flash: 43; "
        "its MTP layer is not trained).")
    hidden_size: int = Field(
        4096, ge=1, description="Hidden width (Flash: 4096); sizes the activations in the memory budget.")
    vocab_size: int = Field(
        129280, ge=1, description="Vocabulary rows of the embedding and output layer (Flash: 129,280); sizes the "
        "logits in the memory budget.")
    residual_streams: int = Field(
        4, ge=1, description="Copies of the hidden state carried between layers (Flash's hyper-connections: hc_mult "
        "4; 1 for a plain transformer); sizes the activations kept under recompute.")
    num_expert_parameters: int = Field(
        277_025_390_592, ge=0, description="Parameters in routed experts, all layers (Flash: 256 x 3 x 4096 x 2048 x "
        "43, counted on transformers' DeepseekV4Config); sharded by EP x ETP, the rest by TP.")
