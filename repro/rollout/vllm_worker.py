"""Code that runs inside vLLM's worker processes (``worker_extension_cls``): routing capture and weight reload.

vLLM mixes this class into its GPU/CPU ``Worker``, so each method is callable by name through
``LLM.collective_rpc`` on every tensor-parallel rank; ``self.model_runner`` is the worker's model runner.
Only plain values cross the RPC (strings, ints, bytes): tensors travel as safetensors bytes, or over
the weight sync's own collective groups, which the workers join (``repro_receive_weights``).

Routing capture. Every MoE router of vLLM calls ``capture_fn(topk_ids)`` with the experts of all tokens of
the current forward step ([tokens_in_step, top_k]); it is the hook vLLM's own routed-experts capturer uses
(that one needs Model Runner V2 and Triton, which the CPU build lacks). To give each token back to its
request, ``_prepare_inputs`` is wrapped: before each step it records the step's layout -- the persistent
batch's request ids in order, how many tokens each is scheduled, and the position of its first scheduled
token (tokens of a step are laid out request by request in that order, which is how vLLM builds
``input_ids``). The capture then cuts ``topk_ids`` by that layout and stores each slice under (request,
layer, first position). Storing by position makes a recomputation after preemption overwrite, not append.
Prefix-cached tokens are never recomputed, so they are never captured: the engine turns prefix caching off
when it records routing.
"""

from __future__ import annotations

import re
from functools import partial

import torch

from repro.sync.apply import drain
from repro.sync.errors import BucketError, SyncError
from repro.sync.group import SyncAddress, SyncGroup, receive_all
from repro.sync.stream import verified_stream

# "<index>_<external id>-<8 random chars>" for the children of an n > 1 request, "<external id>-<8 chars>"
# otherwise (vllm.v1.engine.input_processor.assign_request_id, parallel_sampling.get_child_info).
_INTERNAL_ID = re.compile(r"^(?:(?P<child>\d+)_)?(?P<external>.+)-[0-9A-Za-z]{8}$")


def parse_request_id(internal_id: str) -> tuple[str, int]:
    """Internal vLLM request id -> (external request id, sample index). External ids must hold no "_"
    (``LLM`` numbers its requests "0", "1", ...), so a leading "<digits>_" is always a child index."""
    match = _INTERNAL_ID.match(internal_id)
    if match is None:
        raise ValueError(f"unrecognised vLLM request id {internal_id!r}")
    return match["external"], int(match["child"]) if match["child"] is not None else 0


class ReproWorkerExtension:
    """Methods added to vLLM's Worker; names are prefixed ``repro_`` to stay clear of vLLM's own."""

    # -- routing ------------------------------------------------------------------------------------------
    def repro_install_routing_capture(self) -> list[int]:
        """Hook every MoE router; returns the MoE layer ids hooked (empty: the model has no hookable router)."""
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

        runner = self.model_runner
        if not (hasattr(runner, "_prepare_inputs") and hasattr(runner, "input_batch")):
            raise RuntimeError(
                f"{type(runner).__name__} has no _prepare_inputs/input_batch (Model Runner V2?): the router hook "
                "cannot map tokens to requests; use vLLM's enable_return_routed_experts there"
            )
        self._repro_routing: dict[str, dict[int, dict[int, torch.Tensor]]] = {}
        self._repro_layout: list[tuple[str, int, int]] = []
        layers = []
        for module in runner.get_model().modules():
            if isinstance(module, MoERunner) and isinstance(getattr(module, "router", None), BaseRouter):
                module.router.set_capture_fn(partial(self._repro_capture, module.layer_id))
                layers.append(int(module.layer_id))
        if layers and not getattr(runner, "_repro_layout_wrapped", False):
            original = runner._prepare_inputs

            def prepare_inputs(scheduler_output, num_scheduled_tokens, *args, **kwargs):
                batch = runner.input_batch
                num_reqs = batch.num_reqs
                starts = batch.num_computed_tokens_cpu[:num_reqs].tolist()
                counts = [int(c) for c in num_scheduled_tokens[:num_reqs]]
                self._repro_layout = list(zip(batch.req_ids[:num_reqs], starts, counts))
                return original(scheduler_output, num_scheduled_tokens, *args, **kwargs)

            runner._prepare_inputs = prepare_inputs
            runner._repro_layout_wrapped = True
        return sorted(layers)

    def _repro_capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        ids = topk_ids.detach().to("cpu", torch.int16)  # padded steps carry extra rows at the end
        offset = 0
        for req_id, start, count in self._repro_layout:
            per_layer = self._repro_routing.setdefault(req_id, {}).setdefault(layer, {})
            per_layer[int(start)] = ids[offset: offset + count].clone()
            offset += count

    def repro_take_routing(self, external_ids: list[str]) -> bytes:
        """Routing of the finished requests named (external ids), as safetensors bytes, then forget them.

        Keys are ``"<external id>/<sample>/<layer>"``, values [positions_computed, top_k] int16 in position
        order. Only rank 0 answers; other ranks return empty bytes (TP ranks route identically).
        """
        from safetensors.torch import save

        store = getattr(self, "_repro_routing", {})
        out: dict[str, torch.Tensor] = {}
        wanted = set(external_ids)
        for internal_id in list(store):
            try:
                external, sample = parse_request_id(internal_id)
            except ValueError:
                continue
            if external not in wanted:
                continue
            for layer, chunks in store.pop(internal_id).items():
                ordered = [chunks[start] for start in sorted(chunks)]
                out[f"{external}/{sample}/{layer}"] = torch.cat(ordered) if ordered else torch.empty(0, 0)
        if getattr(self, "rank", 0) != 0:
            return b""
        return save(out) if out else b""

    def repro_clear_routing(self) -> None:
        if hasattr(self, "_repro_routing"):
            self._repro_routing.clear()

    # -- vocabulary ---------------------------------------------------------------------------------------
    def repro_mask_vocab(self, size: int | None) -> int:
        """Give every token id >= ``size`` logit -inf from now on (None: stop); returns the columns masked.

        A checkpoint's vocab_size may exceed its tokenizer (DeepSeek pads it); vLLM trims only its own TP padding
        (``LogitsProcessor`` keeps ``config.vocab_size`` columns), so ids the tokenizer cannot decode stay
        sampleable. verl and LumenRL mask them the same way (``monkey_patch_compute_logits``)."""
        model = self.model_runner.get_model()
        original = getattr(model, "_repro_compute_logits", None) or model.compute_logits
        model._repro_compute_logits = original
        if size is None:
            model.compute_logits = original
            return 0

        def compute_logits(*args, **kwargs):
            logits = original(*args, **kwargs)
            if logits is not None:
                logits[..., size:] = float("-inf")
            return logits

        model.compute_logits = compute_logits
        return max(0, int(model.config.vocab_size) - int(size))

    # -- weights ------------------------------------------------------------------------------------------
    # A streamed update, vLLM's layerwise-reload lifecycle (as its own NCCL weight transfer runs it): begin, then
    # the model's load_weights per bucket (a layer is re-processed, FP8 on GPU, once all its weights arrived),
    # then finish. Names are the checkpoint's (vLLM's WeightsMapper renames); only one bucket is held at a time.
    def repro_begin_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def repro_load_bucket(self, blob: bytes) -> int:
        """Load one bucket (safetensors bytes, checkpoint names); returns the tensors it held."""
        from safetensors.torch import load

        tensors = load(blob)
        self.model_runner.get_model().load_weights(iter(tensors.items()))
        return len(tensors)

    def repro_finish_weight_update(self, repack: bool = True) -> int:
        """Finish the reload; returns the CPU MoE layers re-packed."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.get_model()
        finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)
        return _repack_cpu_experts(model) if repack else 0

    def repro_repack_cpu_experts(self) -> int:
        """After vLLM's own weight-transfer engine finished an update: re-pack the CPU experts (0 on GPUs)."""
        return _repack_cpu_experts(self.model_runner.get_model())

    def repro_receive_weights(self, addresses: list[dict], version: int,
                              expected: dict[str, list]) -> tuple[int, int, int]:
        """Join each sender's sync group (rank 1 + this worker's TP rank; kept for later syncs) and apply the
        buckets as they arrive, each tensor checked against ``expected`` (name -> [shape, dtype]). Returns
        (buckets, tensors, bytes). A failure drains the rest of the stream, then raises."""

        wanted = [SyncAddress(**a) for a in addresses]
        known = {g.address: g for g in getattr(self, "_repro_sync_groups", [])}
        # each group's transport puts its buffers where it carries them: this worker's GPU on NCCL, the host on gloo
        self._repro_sync_groups = [known.get(a) or SyncGroup(a, 1 + getattr(self, "rank", 0)) for a in wanted]
        stream = receive_all(self._repro_sync_groups, version)
        buckets = tensors = nbytes = 0
        arrived: set[str] = set()
        self.repro_begin_weight_update()
        try:
            for label, named in verified_stream(stream, version, len(wanted)):
                for name, tensor in named:
                    check_tensor(name, tensor, expected, version, label)
                self.model_runner.get_model().load_weights(iter(named))
                arrived.update(n for n, _ in named)
                buckets, tensors = buckets + 1, tensors + len(named)
                nbytes += sum(t.numel() * t.element_size() for _, t in named)
        except Exception:
            drain(stream)
            raise
        missing = sorted(set(expected) - arrived)
        if missing:
            raise SyncError(f"weight sync v{version}: the sync ended without tensors {missing[:5]} ({len(missing)})")
        self.repro_finish_weight_update()
        return buckets, tensors, nbytes


def check_tensor(name: str, tensor: torch.Tensor, expected: dict[str, list], version: int, label: str) -> None:
    """One received tensor against the served checkpoint's [shape, dtype] for its name (errors name the bucket)."""
    spec = expected.get(name)
    dtype = str(tensor.dtype).removeprefix("torch.")
    if spec is None:
        raise BucketError(f"weight sync v{version}, {label}: unexpected tensor {name}")
    if list(tensor.shape) != list(spec[0]) or dtype != spec[1]:
        raise BucketError(f"weight sync v{version}, {label}: tensor {name} is {dtype} {list(tensor.shape)}, "
                          f"the checkpoint stores {spec[1]} {list(spec[0])}")
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        raise BucketError(f"weight sync v{version}, {label}: tensor {name} holds NaN or Inf")


def _repack_cpu_experts(model: torch.nn.Module) -> int:
    """Re-pack every CPU MoE layer's experts after a reload; returns how many layers were re-packed.

    vLLM 0.32 (``UnquantizedFusedMoEMethod.process_weights_after_loading``) runs the experts' own
    ``process_weights_after_loading`` -- the CPU pre-pack -- only on the first load, not on weight updates.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm._custom_ops import cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    packed = 0
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise RuntimeError(f"{name}: padded CPU MoE experts cannot be re-packed after a reload")
        with torch.no_grad():
            module.w13_weight.copy_(cpu_prepack_moe_weight(module.w13_weight, experts.isa))
            module.w2_weight.copy_(cpu_prepack_moe_weight(module.w2_weight, experts.isa))
        packed += 1
    return packed


def routing_from_bytes(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(blob) if blob else {}

