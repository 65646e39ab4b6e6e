"""The embedded rollout engine: batched KV-cache sampling on CPU from (dequantised) FP8 weights.

It stands in for the vLLM server of the full recipe and differs from the trainer the same way: it computes
with weights that went through block-wise FP8 quantisation, so its token distribution is genuinely not the
trainer's. Per response it returns the sampled ids, the log-prob of each sampled token under the rollout's
own distribution, the experts every top-k MoE layer chose at every fed position (for R3), and why it stopped.
With ``numerics`` (``repro.rollout.numerics``) it also computes as vLLM's FP8 path does beyond the weights: W8A8
activations, BF16 activations, an FP8 KV cache -- hooks on its own model copy, the decode loop is the same.

Works with any transformers causal LM whose cache is a ``DynamicCache`` passed as ``cache=``/
``past_key_values=``; routing is recorded where ``repro.model.routing`` can hook the routers (DeepSeek-V4, Qwen3-MoE).

Prompts of different lengths are decoded in separate groups rather than padded: DeepSeek-V4's compressed
attention groups absolute positions into blocks, so left padding would shift what each block holds. Within a
group, responses whose histories are still equal share one batch row (a prompt's ``n`` samples share its
prefill) and a response leaves the batch at EOS (``repro.rollout.decode_cache``); DeepSeek-V4's attention reads
its shared K=V head in place (``repro.rollout.shared_kv_attention``).
"""

from __future__ import annotations

import copy
import inspect
import time
from collections import defaultdict
from contextlib import nullcontext
from typing import Callable, Iterable, Literal

import torch
from transformers import DynamicCache

from repro.model import layouts
from repro.model.hf_folder import load_checkpoint
from repro.model.hyper_connection import use_entrywise_hyper_connections
from repro.model.served import ServedWeights, check_update, served_weights, to_state_dict
from repro.model.routing import RoutingError, RoutingRecorder, recordable_routers
from repro.recipes.backends import ROLLOUTS
from repro.recipes.schema import Recipe
from repro.rollout.base import RolloutError, check_prompts
from repro.rollout.decode_cache import RoutingTable, branch, select_rows
from repro.rollout.fp8_view import weight_view_for
from repro.rollout.numerics import RolloutNumerics
from repro.rollout.shared_kv_attention import use_shared_kv_attention
from repro.rollout.types import FinishReason, RolloutResult, SamplingParams, Trajectory
from repro.sync.apply import SyncGate
from repro.sync.errors import BucketError

# which log-prob of a sampled token the engine reports (recipe rollout.logprobs_mode; vLLM's raw/processed_logprobs)
LogprobsMode = Literal["raw", "processed"]
LOGPROBS_MODES: tuple[str, ...] = LogprobsMode.__args__  # type: ignore[attr-defined]

# named tensors as the trainer holds them -> named tensors as the engine computes with (e.g. FP8 round trip)
WeightView = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class RolloutBucketError(RolloutError, BucketError):
    """A weight-sync bucket the engine refuses; the message names the version and the bucket."""


def _identity_view(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return weights


class EmbeddedEngine:
    """A single-process engine over one model instance. ``weight_view`` decides what precision it serves."""

    capabilities = ROLLOUTS["embedded"]

    def __init__(
        self,
        model: torch.nn.Module,
        eos_id: int,
        pad_id: int,
        max_context: int,
        weight_view: WeightView = _identity_view,
        record_routing: bool = True,
        numerics: RolloutNumerics | None = None,
        logprobs_mode: LogprobsMode = "processed",
    ):
        if logprobs_mode not in LOGPROBS_MODES:
            raise RolloutError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self.model = copy.deepcopy(model).eval()
        # DeepSeek-V4's one shared K=V head read in place rather than copied to every query head (same math)
        use_shared_kv_attention(self.model)
        # the hyper-connections' Sinkhorn loop as one compiled call without autograd (same bits, ~1,250 fewer ops)
        use_entrywise_hyper_connections(self.model)
        # vLLM's serving numerics beyond the weights (W8A8, BF16 activations, FP8 KV cache): hooks on this copy
        self.numerics = numerics or RolloutNumerics()
        self.numerics.install(self.model)
        self.eos_id, self.pad_id, self.max_context = eos_id, pad_id, max_context
        self.weight_view = weight_view
        self.record_routing = record_routing and self._has_topk_routers()
        # transformers' DeepSeek-V4 names its cache argument `cache`; most models call it `past_key_values`
        params = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in params else "past_key_values"
        # The names, shapes and dtypes an update must carry: those of the folder the model came from.
        self.served = served_weights(self.model)
        self.weight_version = -1
        self.gate = SyncGate()
        self._swap(dict(model.state_dict()), version=0)
        self._module_state = self.model.state_dict()  # views of the module's tensors, written in place
        self._parts = served_parts(self.served, self._module_state)
        self._staged: dict[str, tuple[torch.Tensor, set[str]]] = {}
        self._arrived: set[str] = set()

    def _has_topk_routers(self) -> bool:
        try:
            recordable_routers(self.model)
        except RoutingError:
            return False
        return True

    # -- weights -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Check the whole update against the served checkpoint's names, shapes and dtypes, convert it, then
        swap: a bad update leaves the old weights serving. Names are the checkpoint's (release names for a
        DeepSeek-V4 folder in the release layout); FP32 tensors must arrive as FP32."""
        received = dict(named_tensors)
        check_update(self.served, received, version, RolloutError)
        self._swap(to_state_dict(self.served, received), version)

    # -- streamed weights: bucket by bucket (repro.sync.apply_stream drives these three) -------------------
    def begin_sync(self, version: int) -> None:
        """Close the gate: from here until ``finish_sync`` the module may hold a mix of versions."""
        self.gate.begin(version)
        self._staged, self._arrived = {}, set()

    @torch.no_grad()
    def apply_bucket(self, named: list[tuple[str, torch.Tensor]], version: int, label: str) -> None:
        """Check each tensor against the served checkpoint and write it into the module. A module tensor made of
        several served ones (stacked release experts) is staged until all its parts arrived; each whole module
        tensor goes through the weight view (FP8 round trip) on its own, as a whole-model update would."""
        for name, tensor in named:
            if name not in self.served.synced:
                why = f" ({layouts.MTP_REASON})" if layouts.is_mtp(name) else ""
                raise RolloutBucketError(f"weight update v{version}, {label}: unexpected tensor {name}{why}")
            check_update(self.served, {name: tensor}, version, RolloutError, partial=True)
            self._arrived.add(name)
            module_name, part = self._parts[name]
            if part.expert is None:
                self._write(module_name, tensor)
                continue
            staged, waiting = self._staged.get(module_name) or (
                torch.empty(self._module_state[module_name].shape, dtype=tensor.dtype),
                {n for n, (m, _) in self._parts.items() if m == module_name})
            part.select(staged).copy_(tensor)
            waiting.discard(name)
            self._staged[module_name] = (staged, waiting)
            if not waiting:
                del self._staged[module_name]
                self._write(module_name, staged)

    def _write(self, module_name: str, tensor: torch.Tensor) -> None:
        self._module_state[module_name].copy_(self.weight_view({module_name: tensor})[module_name])

    def finish_sync(self, version: int) -> None:
        """Every served tensor arrived: open the gate at ``version``; else raise naming what is missing."""
        missing = [n for n in self.served.synced if n not in self._arrived]
        if missing:
            raise RolloutError(f"weight update v{version}: the sync ended without tensors {missing[:5]}"
                               f"{'...' if len(missing) > 5 else ''} ({len(missing)} missing)")
        self._staged, self._arrived = {}, set()
        self.weight_version = version
        self.gate.finish()

    def _swap(self, state: dict[str, torch.Tensor], version: int) -> None:
        expected = self.model.state_dict()
        mismatched = sorted(set(expected) ^ set(state))
        if mismatched:  # the served checkpoint and the module disagree: a bug here, not a bad update
            raise RolloutError(f"weight update v{version}: module and checkpoint disagree on {mismatched[:5]}")
        served = self.weight_view(state)
        self.model.load_state_dict(served, strict=True)
        self.weight_version = version
        self.gate.finish()

    # -- sampling ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        """``params.n`` responses per prompt, prompt-major. Deterministic for ``params.seed``. Refused while a
        weight sync is under way or after one failed, until a complete sync succeeds."""
        self.gate.check(RolloutError)
        check_prompts(prompts, self.max_context)
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(params.seed)
        by_length: dict[int, list[int]] = defaultdict(list)
        for index, prompt in enumerate(prompts):
            by_length[len(prompt)].append(index)
        found: dict[tuple[int, int], Trajectory] = {}
        for length in sorted(by_length):
            indices = by_length[length]
            rows = [(i, s) for i in indices for s in range(params.n)]
            ids = torch.tensor([prompts[i] for i in indices], dtype=torch.int64)
            max_new = min(params.max_new_tokens, self.max_context - length)
            for (i, s), traj in zip(rows, self._decode(ids, max_new, params, generator)):
                traj.prompt_index, traj.sample_index = i, s
                found[(i, s)] = traj
        trajectories = [found[(i, s)] for i in range(len(prompts)) for s in range(params.n)]
        generated = sum(len(t.response_ids) for t in trajectories)
        return RolloutResult(trajectories, generated, time.perf_counter() - start)

    def _decode(self, prompt_ids: torch.Tensor, max_new: int, params: SamplingParams, generator) -> list[Trajectory]:
        """``params.n`` responses to each row of ``prompt_ids`` [P, L], prompt-major. Responses with the same
        history so far share a batch row (each prompt is prefilled once); a response that sampled EOS leaves the
        batch (``repro.rollout.decode_cache``)."""
        prompts, prompt_len = prompt_ids.shape
        rows = prompts * params.n
        cache = self.numerics.wrap_cache(DynamicCache(config=self.model.config), self.model.config)
        recorder = RoutingRecorder(self.model) if self.record_routing else None
        routing = RoutingTable(rows, prompt_len + max_new - 1)
        token_table = torch.full((rows, max_new), self.pad_id, dtype=torch.int64)
        logprob_table = torch.zeros(rows, max_new)
        live = torch.arange(rows)  # the responses still sampling
        node = torch.arange(prompts).repeat_interleave(params.n)  # the batch row each live response reads
        with recorder or nullcontext():
            logits = self._forward(prompt_ids, cache)
            if recorder:
                routing.add(recorder.take(), live, node, 0)
            for step in range(max_new):
                token, logprob = self._sample(logits[node], params, generator, step)
                token_table[live, step], logprob_table[live, step] = token, logprob
                going = token != self.eos_id
                if step == max_new - 1 or not going.any():
                    break
                live = live[going]
                parent, fed, node = branch(node[going], token[going], logits.shape[-1])
                select_rows(cache, parent, len(logits))
                logits = self._forward(fed[:, None], cache)
                if recorder:
                    routing.add(recorder.take(), live, node, prompt_len + step)
        return [self._trajectory(row, prompt_ids[row // params.n], token_table[row], logprob_table[row],
                                 routing.tables) for row in range(rows)]

    def _sample(self, logits: torch.Tensor, params: SamplingParams, generator, step: int):
        if not torch.isfinite(logits).all():
            raise RolloutError(f"rollout produced non-finite log-probs at step {step} (weights v{self.weight_version})")
        token, logprob = sample_tokens(logits, params, generator, raw_logprobs=self.logprobs_mode == "raw")
        if not torch.isfinite(logprob).all():
            raise RolloutError(f"rollout produced non-finite log-probs at step {step} (weights v{self.weight_version})")
        return token, logprob

    def _forward(self, ids: torch.Tensor, cache) -> torch.Tensor:
        cache_kwarg = {self._cache_argument: cache}
        logits = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwarg).logits
        return logits[:, -1].float()

    def _trajectory(self, row, prompt, tokens, logprobs, routing) -> Trajectory:
        eos_at = (tokens == self.eos_id).nonzero()
        length = int(eos_at[0]) + 1 if len(eos_at) else len(tokens)
        fed = len(prompt) + length - 1
        return Trajectory(
            prompt_index=-1,
            sample_index=-1,
            prompt_ids=prompt.tolist(),
            response_ids=tokens[:length].tolist(),
            logprobs=logprobs[:length].clone(),
            finish_reason=FinishReason.EOS if len(eos_at) else FinishReason.LENGTH,
            weight_version=self.weight_version,
            routing={layer: table[row, :fed].clone() for layer, table in routing.items()},
        )


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generator,
                  raw_logprobs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from softmax(logits / T), optionally top-k/top-p filtered.

    Args: logits [B, V] float32. Returns (tokens [B] int64, logprobs [B] float32) where the log-prob is that of
    the token under log_softmax(logits / T) -- the distribution the trainer recomputes; with top_p = 1 and
    top_k = -1 (training rollouts) exactly the distribution sampled from (vLLM's ``processed_logprobs``). With
    ``raw_logprobs`` it is the token's log_softmax(logits) at T = 1 instead, as vLLM's default ``raw_logprobs``
    reports it; the tokens sampled are the same either way.
    """
    scaled = logits / params.temperature
    logp = torch.log_softmax(logits if raw_logprobs else scaled, dim=-1)
    filtered = scaled
    if params.top_k > 0:
        kth = torch.topk(filtered, min(params.top_k, filtered.shape[-1]), dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p  # keeps the top token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def served_parts(served: ServedWeights, state: dict[str, torch.Tensor]) -> dict[str, tuple[str, layouts.Part]]:
    """served name -> (module state-dict name, the part of that tensor it fills): release expert tensors are rows
    of the module's stacked experts; every other tensor is a whole module tensor."""
    if served.layout != layouts.DEEPSEEK:
        return {name: (name, layouts.Part(name, tuple(state[name].shape))) for name in served.synced}
    parts = {}
    for module_name, tensor in state.items():
        for part in layouts.release_parts(module_name, tuple(tensor.shape)):
            parts[part.name] = (module_name, part)
    return {name: parts[name] for name in served.synced}


def build_engine(recipe: Recipe, model_dir) -> EmbeddedEngine:
    """The engine of ``repro.recipes.backends.ROLLOUTS["embedded"]``: the model folder's weights served through
    the recipe's weight view (FP8 round trip) and numerics."""
    model, tokenizer = load_checkpoint(model_dir)
    r = recipe.rollout
    return EmbeddedEngine(
        model,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        max_context=recipe.lengths.max_context,
        weight_view=weight_view_for(r.weight_format, r.fp8_format, r.fp8_block, r.fp8_scale),
        record_routing=recipe.routing_replay.enabled,
        numerics=RolloutNumerics.from_rollout(r),
        logprobs_mode=r.logprobs_mode,
    )
