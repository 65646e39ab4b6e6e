"""How it trains: the trainer, optimizer, rollout, lengths, data, algorithm, correction, routing replay, reward,
evaluation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from repro.recipes.schema.section import RolloutName, Section, TrainerName


class ActorConfig(Section):
    backend: TrainerName = Field(
        "megatron", description="Trainer backend: Megatron-core on a cluster, the embedded torch trainer on CPU.")
    num_workers: int = Field(16, ge=1, description="Trainer processes (one per GPU on a cluster).")
    nodes: int = Field(2, ge=1, description="Nodes the trainer group is packed onto; they host no rollout.")
    tensor_parallel: int = Field(4, ge=1, description="Tensor-parallel size (TP).")
    pipeline_parallel: int = Field(4, ge=1, description="Pipeline-parallel size (PP).")
    expert_parallel: int = Field(
        4, ge=1, description="Expert-parallel size (EP); must divide model.num_routed_experts.")
    expert_tensor_parallel: int = Field(1, ge=1, description="Tensor parallelism inside each expert (ETP).")
    sequence_parallel: bool = Field(True, description="Megatron sequence parallelism alongside TP.")
    recompute: Literal["full", "none"] = Field("full", description="Activation recomputation granularity.")
    dtype: Literal["bf16", "fp32"] = Field(
        "bf16", description="Trainer compute dtype; the rollout differs from it by FP8 quantisation.")
    optimizer_cpu_offload: bool = Field(
        True, description="Keep optimizer state in host memory (AMD: offloaded to CPU).")
    optimizer_offload_fraction: float = Field(
        1.0, ge=0, le=1, description="Share of the optimizer state held and stepped in host memory when "
        "optimizer_cpu_offload is on (megatron optimizer_offload_fraction; LumenRL's DSV4 config: 1.0).")
    optimizer_moment_dtype: Literal["fp32", "bf16"] = Field(
        "bf16", description="dtype of Adam's two moments (LumenRL's DSV4 config: bf16; megatron "
        "exp_avg_dtype/exp_avg_sq_dtype); the embedded AdamW keeps fp32.")
    num_layers_in_first_pipeline_stage: int | None = Field(
        11, ge=1, description="Layers on the first pipeline stage; null: an even split (LumenRL splits Flash's 43 "
        "layers 11/11/11/10).")
    num_layers_in_last_pipeline_stage: int | None = Field(
        10, ge=1, description="Layers on the last pipeline stage; null: an even split. The middle stages share the "
        "rest evenly.")
    max_tokens_per_micro_batch: int = Field(
        8192, ge=1, description="Token budget of one micro-batch per GPU (LumenRL max_token_len_per_gpu).")
    model_provider: str | None = Field(
        None, description="Megatron backend: 'package.module:function' building a rank's model (None: must be set to "
        "launch; docs/megatron-dsv4.md).")
    old_logprobs_from_update: bool = Field(
        True, description="Embedded trainer: take pi_old from the update's own first forward when that is exact (one "
        "update per step, a non-rejecting correction mode); false, or otherwise: a separate rescoring pass.")
    bf16_gemm: Literal["auto", "native", "fp32"] = Field(
        "auto", description="Embedded BF16 trainer on a CPU: how its GEMMs compute (repro.train.bf16_gemm). native: "
        "torch's BF16 matmul (oneDNN; fast only on AVX512/AMX CPUs, ~1 GFLOP/s on AVX2-only ones); fp32: an FP32 GEMM "
        "of the BF16 operands rounded once to BF16, as a GPU's BF16 GEMM; auto: native where oneDNN computes BF16 on "
        "this CPU, else fp32 ($REPRO_BF16_GEMM picks instead when set). Chosen once per run start and logged as "
        "actor/bf16_gemm_fp32.")
    cpu_update_threads: int = Field(
        1, ge=1, description="Embedded trainer: Python threads that split each update's rows and each scoring pass, "
        "each on its own copy of the model's modules sharing the weights (repro.train.threads); gradients are added "
        "in thread order, so a run stays deterministic. The loop runs one phase at a time: on a 2-core machine a "
        "second thread uses the core the idle rollout worker leaves.")


class OptimConfig(Section):
    lr: float = Field(1.0e-6, gt=0, description="Adam learning rate, constant.")
    schedule: Literal["constant"] = Field("constant", description="Learning-rate schedule.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps before the constant rate.")
    betas: list[float] = Field([0.9, 0.98], min_length=2, max_length=2, description="Adam (beta1, beta2).")
    eps: float = Field(1.0e-8, gt=0, description="Adam epsilon.")
    weight_decay: float = Field(0.1, ge=0, description="Decoupled weight decay (AdamW).")
    weight_decay_rule: Literal["megatron", "all"] = Field(
        "megatron", description="Which parameters weight_decay applies to: megatron = all but biases and 1-D "
        "parameters (norm scales, ...), megatron-core's rule (wd_mult 0), which LumenRL's OptimizerParamScheduler "
        "applied in AMD's run; all = every parameter, as repro did before.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")


class RolloutConfig(Section):
    backend: RolloutName = Field(
        "vllm", description="Rollout engine: vLLM server on a cluster, the embedded CPU engine otherwise.")
    num_replicas: int = Field(1, ge=1, description="Independent rollout engines.")
    tensor_parallel: int = Field(8, ge=1, description="GPUs per rollout replica (AMD: TP8 on the third node).")
    weight_format: Literal["fp8_block", "bf16"] = Field(
        "fp8_block", description="Weights the rollout serves: block-wise FP8, or the trainer's BF16.")
    fp8_format: Literal["auto", "e4m3fn", "e4m3fnuz"] = Field(
        "auto", description="FP8 encoding; 'auto' picks e4m3fnuz on gfx942 (MI300/MI308X), e4m3fn elsewhere.")
    fp8_block: list[int] = Field(
        [128, 128], min_length=2, max_length=2, description="Quantisation block (rows, cols) with one fp32 scale "
        "each.")
    fp8_scale: Literal["fp32", "ue8m0"] = Field(
        "fp32", description="Block scale encoding: plain fp32, or power-of-two as DeepSeek's own V4 checkpoints.")
    gpu_memory_utilization: float = Field(
        0.92, gt=0, le=1, description="Fraction of GPU memory vLLM may take (LumenRL's file at 2232f55, what ran: "
        "0.92; the post says 0.90).")
    disable_custom_all_reduce: bool = Field(
        True, description="vLLM's disable_custom_all_reduce: TP all-reduce through RCCL/NCCL instead of vLLM's custom "
        "kernel (LumenRL's file: true).")
    kv_cache_dtype: Literal["fp8_e4m3", "auto"] = Field(
        "fp8_e4m3", description="KV-cache dtype (DSV4's attention layout in vLLM needs FP8: fp8_ds_mla, e4m3 NoPE in "
        "64-channel blocks with power-of-two scales, BF16 RoPE; the embedded engine emulates it).")
    max_num_seqs: int = Field(48, ge=1, description="Sequences decoded concurrently per replica.")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Token budget per engine step (chunked prefill).")
    enforce_eager: bool = Field(True, description="Disable graph capture (AMD/LumenRL run eager).")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature of training rollouts.")
    requests: Literal["per_sample", "per_prompt"] = Field(
        "per_sample", description="How responses are asked for: per_sample = each prompt sent responses_per_prompt "
        "times as n=1 requests, as LumenRL does (AMD's run; each request prefills the prompt itself); per_prompt = "
        "one request of n responses per prompt (vLLM prefills the prompt once). Training and evaluation alike; every "
        "request is seeded either way (repro.run.steps).")
    logprobs_mode: Literal["raw", "processed"] = Field(
        "raw", description="The rollout's log-prob of each sampled token, which the TIS weights and the mismatch "
        "metrics set against the trainer's log_softmax(logits / T): raw = log_softmax(logits) at T = 1, vLLM's "
        "default raw_logprobs, which AMD's run used (LumenRL sets no logprobs_mode), so its KL and weights include "
        "the temperature; processed = log_softmax(logits / T), the distribution sampled from (vLLM "
        "processed_logprobs), the pure rollout/trainer mismatch. Honoured by the vLLM and the embedded engine.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of training rollouts (1 = off).")
    top_k: int = Field(-1, description="Top-k sampling of training rollouts (-1 = off).")
    activation_quant: Literal["fp8_per_token_group", "none"] = Field(
        "fp8_per_token_group", description="W8A8: activations entering each block-FP8 linear are quantised per token "
        "in groups of activation_group channels with a dynamic scale (vLLM fp8_per_block; applies with weight_format "
        "fp8_block only; the embedded engine emulates it, vLLM always does it).")
    activation_group: int = Field(
        128, ge=1, description="Channels per activation scale for activation_quant (vLLM/DeepSeek: 128; a narrower "
        "row is one group).")
    activation_dtype: Literal["bf16", "fp32"] = Field(
        "bf16", description="Dtype of every GEMM output and of the hidden streams between layers in the rollout (vLLM "
        "serves in BF16; the embedded engine rounds to it).")


class LengthConfig(Section):
    max_context: int = Field(
        16384, ge=2, description="Prompt + response tokens per sequence (AMD: 16,384; the model supports 1M).")
    max_response: int = Field(4096, ge=1, description="Generated tokens per response before truncation.")


class DatasetConfig(Section):
    kind: Literal["dapo_math", "aime_2024", "tiny_math_train", "tiny_math_held_out", "tiny_math_long_train",
                  "tiny_math_long_held_out"] = Field(
        description="Which dataset layout to read (or generate, for tiny_math_*; tiny_math_long_*: answers that show "
        "a running total, repro/data/tinymath_long.py).")
    path: str | None = Field(None, description="Local file (parquet or jsonl); required for dapo_math and aime_2024.")
    template: Literal["stored", "dapo", "tiny"] = Field(
        "stored", description="The prompt's text: stored = the row's messages exactly as the file holds them, as "
        "LumenRL reads them (AMD's run; a bare problem/answer row becomes one user turn of the problem); dapo = the "
        "bare problem re-wrapped in DAPO's 'Answer:' instruction; tiny = the tiny task's 'a+b='.")
    on_malformed: Literal["skip", "fail"] = Field(
        "skip", description="A malformed row is skipped and counted, or stops the load naming the row.")
    dedupe: bool = Field(
        False, description="Drop repeated problems. AMD's run did not: LumenRL samples every row of the file, and "
        "DAPO-Math-17K repeats each problem ~100 times, so a problem's chance is its share of rows (the tiny sets "
        "hold no repeats).")
    digits: int = Field(2, ge=1, le=3, description="Operand width of tiny-math problems (the difficulty knob).")
    terms: int = Field(
        12, ge=1, le=99, description="Worked lines of a tiny_math_long_* response, ~12 tokens each (the length knob: "
        "12 gives ~160-token responses); ignored by the other kinds.")

    @model_validator(mode="after")
    def _path_given_for_files(self) -> "DatasetConfig":
        if self.kind in ("dapo_math", "aime_2024") and not self.path:
            raise ValueError(f"path: required for kind {self.kind!r}")
        return self


class DataConfig(Section):
    order: Literal["randperm", "epochs"] = Field(
        "randperm", description="The training prompts' order: randperm = LumenRL's (AMD's run): torch.randperm over "
        "the file's rows from a CPU generator seeded with the recipe's seed, read with a cursor that wraps around the "
        "same permutation, so on the same file the prompts are AMD's; epochs = a fresh Python-random permutation per "
        "epoch, a batch never crossing an epoch's end (repro.data.sampler). Held-out problems are read in file order "
        "either way.")
    chat_encoding: Literal["auto", "deepseek_v4", "chat_template", "none"] = Field(
        "auto", description="How the prompt's messages become the model's text: auto = LumenRL's rule (AMD's run): "
        "the tokenizer's chat template if it has one, else DeepSeek-V4's encoder (thinking mode: BOS <｜User｜>... "
        "<｜Assistant｜><think>) if the tokenizer knows its turn tokens, else an error; DeepSeek-V4's release has no "
        "template, so auto is its encoder; deepseek_v4 / chat_template: that one always; none = BOS + the user turn's "
        "text, no turn markers (the tiny model's: its tokenizer has neither). The text is tokenized without added "
        "special tokens, as LumenRL does.")
    train: DatasetConfig = Field(
        default_factory=lambda: DatasetConfig(kind="dapo_math",
                                              path="/dev/shm/datasets/dapo-math-17k/dapo-math-17k.parquet"),
        description="Training prompts.")
    eval: DatasetConfig = Field(
        default_factory=lambda: DatasetConfig(kind="aime_2024", path="/dev/shm/datasets/aime-2024/aime-2024.parquet"),
        description="Held-out evaluation problems.")


class AlgorithmConfig(Section):
    prompts_per_step: int = Field(32, ge=1, description="Prompts sampled per optimizer step.")
    responses_per_prompt: int = Field(8, ge=2, description="Responses per prompt: the GRPO group size.")
    norm_adv_by_std: bool = Field(
        True, description="Divide group-centred rewards by the group std (GRPO); false gives Dr.GRPO.")
    adv_std: Literal["population", "sample"] = Field(
        "population", description="The group std GRPO divides by: population = the population std clamped below at "
        "1e-8, as LumenRL's GRPO (AMD's run); sample = verl's unbiased std + 1e-6 (0.935x the advantages at G = 8).")
    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="PPO clip epsilon below 1.")
    clip_ratio_high: float = Field(0.28, gt=0, description="PPO clip epsilon above 1 (DAPO clip-higher).")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "seq-mean-token-mean", description="How per-token losses become one number.")
    clip_ratio_c: float | None = Field(
        None, gt=1, description="Dual-clip constant c (Ye et al. 2020, arXiv:1912.09729): a negative-advantage "
        "token's loss is capped at -A*c. null: off, as AMD ran (LumenRL 2232f55 calls its GRPO loss on the Megatron "
        "path without it, and its default 0.0 means off); verl's default is 3.0.")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to a reference policy (0: none, as AMD).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus (0: none).")
    updates_per_step: int = Field(
        1, ge=1, description="Optimizer updates per rollout batch (1: on-policy, one global batch of 256).")


class RolloutCorrectionConfig(Section):
    mode: Literal["token", "sequence", "token_mask", "sequence_mask", "none"] = Field(
        "token", description="Importance weighting between rollout and trainer (verl/LumenRL rollout_is).")
    threshold: float = Field(2.0, ge=1, description="Upper cap C of w = min(exp(logp_old - logp_rollout), C).")
    lower_threshold: float | None = Field(
        None, gt=0, le=1, description="Lower bound for the *_mask modes (IcePop); null: 1/threshold.")
    verl_metrics: bool = Field(
        False, description="Also log the IS statistics as verl defined them before its PR #5722 (verl 0.9.1's "
        "rollout_corr/* follow LumenRL's) (weights clamped to [1/C, C] for the ESS and std, mean/max/min of the "
        "untruncated weights) under rollout_corr_verl/; the rollout_corr/ keys always follow LumenRL, AMD's "
        "definitions (weights clamped to [0, C], statistics of the truncated weights).")


class RoutingReplayConfig(Section):
    enabled: bool = Field(True, description="R3: the trainer reuses the rollout's recorded top-k experts.")
    mode: Literal["hard_assignment"] = Field(
        "hard_assignment", description="Replay the expert ids; gate weights come from the trainer's router.")


class RewardConfig(Section):
    kind: Literal["dapo_math"] = Field("dapo_math", description="Reward rule (verl math_dapo: 'Answer:' line, +1/-1).")
    verifier: Literal["dapo", "math_verify"] = Field(
        "dapo", description="Answer checker; math_verify is stricter and optional.")
    boxed_fallback: bool = Field(
        True, description="A response with no 'Answer:' line is scored on its last \\boxed{...}, as LumenRL's reward "
        "does since 2232f55 (AMD's run); false: scored -1 (verl 0.9.1's math_dapo has a boxed fallback of its own, by "
        "other rules: repro/verl/reward_fn.py).")


class EvalConfig(Section):
    every_steps: int = Field(
        5, ge=1, description="Evaluate after every this many steps, and after the last (AMD: LumenRL's val_steps 5; "
        "the post gives no interval, only AIME at the start and the end).")
    at_start: bool = Field(
        False, description="Evaluate before the first update (step 0); LumenRL's trainer never does.")
    after_first_update: bool = Field(
        True, description="Evaluate after the first update (step 1), as LumenRL's EvalCallback does when eval.enabled "
        "(AMD's run: its interval of 1,000 fires once, at step 1), so AMD's 'start' AIME figure is step 1's.")
    answer_format: bool = Field(
        True, description="Append LumenRL's evaluation line '\\n\\nPut the final answer on its own line as: Answer: "
        "\\boxed{answer}.' to the last user turn of each held-out prompt that has no 'Answer:' (AMD's run: "
        "rl_trainer.py calls _extract_prompt_gt with ensure_answer_format=True); false: the prompt as the data and "
        "template make it.")
    samples_per_problem: int = Field(8, ge=1, description="Generations per problem; accuracy is avg@k over them.")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature for evaluation.")
    top_p: float = Field(0.7, gt=0, le=1, description="Nucleus sampling for evaluation.")
