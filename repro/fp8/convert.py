"""Convert an HF-layout BF16 checkpoint folder to block-wise FP8, one shard at a time.

    result = convert_checkpoint("ckpt-bf16", "ckpt-fp8", ConvertOptions(fmt="e4m3fnuz", workers=4))

What it guarantees:
- Everything that can be checked before writing is checked first (config is a causal LM, every shard named
  by the index exists, every shard's header is sound, every dtype is expected), so bad input fails with an
  error naming the file and tensor and leaves no output folder.
- Shards are streamed: a tensor is read, converted (`repro.fp8.stream.quantize_tensors`, checked against the
  error bound) and written before the next is read, so memory is bounded by the largest tensor (plus
  cache-sized scratch), not by the shard or the model. `workers` converts shards in parallel processes.
- The output is never the input, a folder holding it or a folder inside it; `overwrite` replaces only a folder
  this module wrote (its `fp8_conversion.json`), and a `<output>.partial` only when it is a conversion this module
  left (its `.run.json`): anything else is refused naming it, and nothing is removed (repro.owned).
- The output is built in `<output>.partial` and renamed to `<output>` only when complete. Each finished
  shard is fsync'd and gets a done-marker (`.done/<shard>.json`: input size/mtime, output CRC-32, stats);
  a re-run with the same options skips shards whose marker and output still match, and a run that fails on
  bad input removes `<output>.partial`.
- An e4m3fn FP8 checkpoint given with fmt="e4m3fnuz" is converted by vLLM's ROCm rule instead.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import repro
from repro.errors import CheckpointError
from repro.fp8.inputs import CONFIG, FN_TO_FNUZ, INDEX, QUANTISE, ShardPlan, is_deepseek_v4, plan_shards, read_config
from repro.fp8.quant import BLOCK_SIZE, FP8Format, get_format
from repro.fp8.safetensors_io import StreamingWriter, file_crc32, read_tensor, tensor_filler
from repro.fp8.rules import release_scale_name, scale_name
from repro.fp8.stream import fn_to_fnuz_tensors, quantize_tensors
from repro.fp8.verify import TensorStats, stats_table, summarise
from repro.owned import NotOurs, check_apart, check_replaceable

REPORT = "fp8_conversion.json"
ELSEWHERE = "name another folder with --output"
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".index.json")


@dataclass
class ConvertOptions:
    fmt: str = "e4m3fn"  # or "e4m3fnuz" (MI300/MI308X)
    pow2_scale: bool = False  # UE8M0 scales, rounded up to a power of two
    workers: int = 1  # shards converted in parallel processes
    threads: int = 0  # threads quantising the slabs of each tensor, per worker; 0: the cores / workers
    max_rel_error: float | None = None  # per-tensor failure threshold; None = the theoretical bound
    fsync: bool = True  # fsync each shard before marking it done
    overwrite: bool = False  # replace an existing output folder
    progress: bool = True  # tqdm bar over input bytes
    block_size: int = BLOCK_SIZE


@dataclass
class ConversionResult:
    output_dir: Path
    mode: str
    stats: list[TensorStats]
    input_bytes: int  # bytes of the input shards
    output_bytes: int  # bytes of the output shards
    seconds: float  # the whole call, worker start-up included
    shard_seconds: float  # first shard started -> last shard finished (this run's shards), start-up excluded
    shards: int
    shards_resumed: int
    peak_rss_bytes: int  # largest peak RSS of this process and of the workers that converted shards
    peak_rss_self_bytes: int  # this process alone (includes whatever it held before the conversion)
    summary: dict = field(default_factory=dict)

    @property
    def gb_per_s(self) -> float:
        return self.input_bytes / max(self.seconds, 1e-9) / 1e9

    def table(self):
        return stats_table(self.stats)


def convert_checkpoint(src: str | Path, dst: str | Path, options: ConvertOptions | None = None) -> ConversionResult:
    opts = options or ConvertOptions()
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    check_apart(dst, [src], ELSEWHERE)
    fmt = get_format(opts.fmt)
    config, mode = read_config(src, fmt)
    shards = plan_shards(src, fmt, mode, opts.block_size, config=config)
    release = is_deepseek_v4(config)
    if (dst.exists() or dst.is_symlink()) and not opts.overwrite:
        raise CheckpointError(f"{dst}: output folder exists (pass overwrite / --overwrite to replace it)")
    check_replaceable(dst, ours=is_conversion_folder, what="converted checkpoint", marker=REPORT, flag=ELSEWHERE,
                      sources=[src])
    tmp = dst.with_name(dst.name + ".partial")
    _prepare_partial(tmp, {"repro": repro.__version__, "mode": mode, "fmt": fmt.name, "pow2_scale": opts.pow2_scale,
                           "block_size": opts.block_size, "max_rel_error": opts.max_rel_error,
                           "src": str(src.resolve())})
    markers, todo = {}, []
    for sh in shards:
        marker = _valid_marker(tmp, sh)
        if marker:
            markers[sh.name] = marker
        else:
            todo.append(sh)
    total = sum(sh.fingerprint["size"] for sh in shards)
    try:
        markers.update(_run(todo, tmp, mode, fmt, opts, total, total - sum(sh.fingerprint["size"] for sh in todo),
                            release))
    except CheckpointError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stats = [TensorStats.from_dict(d) for sh in shards for d in markers[sh.name]["stats"]]
    _finalize(src, dst, tmp, config, shards, fmt, mode, opts, stats)
    usage_self = current_peak_rss()
    usage_workers = max((markers[sh.name]["peak_rss_bytes"] for sh in todo), default=0)  # this run's
    return ConversionResult(
        output_dir=dst, mode=mode, stats=stats, input_bytes=total,
        output_bytes=sum(markers[sh.name]["output"]["size"] for sh in shards),
        seconds=time.perf_counter() - start, shards=len(shards), shards_resumed=len(shards) - len(todo),
        shard_seconds=max((markers[sh.name]["finished"] for sh in todo), default=0.0)
        - min((markers[sh.name]["started"] for sh in todo), default=0.0),
        peak_rss_bytes=max(usage_self, usage_workers), peak_rss_self_bytes=usage_self,
        summary=summarise(stats),
    )


def is_conversion_folder(folder: Path) -> bool:
    """A folder this module wrote: its report names the source, the mode and the format."""
    try:
        report = json.loads((folder / REPORT).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"source", "mode", "format"} <= set(report)


def current_peak_rss() -> int:
    """Peak resident set of this process: VmHWM, which (unlike getrusage's ru_maxrss) does not carry over the
    RSS of the parent that forked a process before it exec'd python."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux; other systems: see VmHWM


# ---------------------------------------------------------------------------------------------- running
_progress = None  # callable(nbytes) in this process, or a queue in a worker process


def _init_worker(queue) -> None:
    global _progress
    _progress = queue.put
    torch.set_num_threads(1)  # see _run


def _convert_shard(sh: ShardPlan, tmp: str, mode: str, fmt_name: str, opts: ConvertOptions,
                   release: bool = False) -> dict:
    """Convert one shard into `tmp`, fsync it, write its done-marker; returns the marker. ``release``: name block
    scales as the DeepSeek-V4 release does (`.scale`)."""
    started = time.time()
    tmp_dir = Path(tmp)
    out_partial = tmp_dir / (sh.name + ".incomplete")
    stats: list[TensorStats] = []
    writer = StreamingWriter(out_partial, sh.outputs)
    try:
        with open(sh.src, "rb") as f:
            if _progress:
                _progress(sh.fingerprint["size"] - sum(t.nbytes for t in sh.tensors))  # header bytes

            # One read buffer for the shard: each tensor is converted and written before the next is read.
            buffer = torch.empty(max((t.nbytes for t in sh.tensors), default=0), dtype=torch.uint8)

            def read(info):
                tensor = read_tensor(f, info, sh.src, buffer)
                if _progress:
                    _progress(info.nbytes)
                return tensor

            def place(info):  # read later, slab by slab, by the quantiser's threads
                if _progress:
                    _progress(info.nbytes)
                return tensor_filler(f.fileno(), info, sh.src, buffer)

            if mode == QUANTISE:
                converted = quantize_tensors(
                    sh.items(read, place), fmt_name, pow2_scale=opts.pow2_scale, block_size=opts.block_size,
                    max_rel_error=opts.max_rel_error, on_stats=stats.append, where=sh.src,
                    scale_namer=release_scale_name if release else scale_name, threads=_threads(opts),
                    overwrite_input=True,  # each tensor is in `buffer`, written out before the next is read
                    on_ready=writer.stream,  # its finished front goes to the disk while the rest is quantised
                )
            else:
                converted = fn_to_fnuz_tensors(sh.items(read), sh.scales, on_stats=stats.append, where=sh.src)
            for name, tensor in converted:
                writer.write(name, tensor)
        crc = writer.close(fsync=opts.fsync)
    except BaseException:
        writer.abort()
        raise
    out = tmp_dir / sh.name
    os.replace(out_partial, out)
    for s in stats:
        s.shard = sh.name
    marker = {
        "shard": sh.name,
        "input": sh.fingerprint,
        "output": {"size": out.stat().st_size, "crc32": crc},
        "stats": [s.to_dict() for s in stats],
        "peak_rss_bytes": current_peak_rss(),  # of the process that converted this shard
        "started": started,
        "finished": time.time(),
    }
    _write_json_atomic(tmp_dir / ".done" / f"{sh.name}.json", marker)
    return marker


def _threads(opts: ConvertOptions) -> int:
    return opts.threads if opts.threads > 0 else max(1, (os.cpu_count() or 1) // max(1, opts.workers))


def _run(todo: list[ShardPlan], tmp: Path, mode: str, fmt: FP8Format, opts: ConvertOptions, total: int, already: int,
         release: bool = False) -> dict:
    global _progress
    from tqdm.auto import tqdm

    markers: dict = {}
    todo = sorted(todo, key=lambda sh: -sh.fingerprint["size"])  # largest first balances the workers
    bar = tqdm(total=total, initial=already, unit="B", unit_scale=True, unit_divisor=1024,
               desc=f"fp8 {fmt.name}", disable=not opts.progress)
    try:
        workers = min(max(1, opts.workers), len(todo))
        if workers <= 1:
            # One intra-op thread: the slab ops are cache-sized, and OpenMP threads that wait for each other
            # on a busy machine made a run ~50x slower here. Parallelism comes from `workers` processes.
            _progress, threads = bar.update, torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                for sh in todo:
                    markers[sh.name] = _convert_shard(sh, str(tmp), mode, fmt.name, opts, release)
            finally:
                torch.set_num_threads(threads)
            return markers
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(queue,)) as pool:
            pending = {pool.submit(_convert_shard, sh, str(tmp), mode, fmt.name, opts, release) for sh in todo}
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    _drain(queue, bar)
                    for fut in done:
                        marker = fut.result()
                        markers[marker["shard"]] = marker
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
        _drain(queue, bar)
        return markers
    finally:
        _progress = None
        bar.close()


def _drain(queue, bar) -> None:
    import queue as queue_mod

    while True:
        try:
            bar.update(queue.get_nowait())
        except queue_mod.Empty:
            return


# ------------------------------------------------------------------------------- partial folder, markers
def _prepare_partial(tmp: Path, run_key: dict) -> None:
    """Create `tmp`, or keep it for resuming if it was started with the same options; else start afresh."""
    run_file = tmp / ".run.json"
    if tmp.is_symlink() or (tmp.exists() and not tmp.is_dir()):
        raise NotOurs(f"{tmp}: exists and is not a folder repro made; nothing was removed: {ELSEWHERE}")
    if tmp.exists():
        try:
            left = json.loads(run_file.read_text())
        except (OSError, ValueError):
            left = None
        if not (isinstance(left, dict) and "repro" in left and "src" in left):
            raise NotOurs(f"{tmp}: exists and is not a conversion repro left (no .run.json); nothing was removed: "
                          f"remove it yourself, or {ELSEWHERE}")
        if left != run_key:  # our own partial output of other options: not resumable
            shutil.rmtree(tmp)
    (tmp / ".done").mkdir(parents=True, exist_ok=True)
    if not run_file.exists():
        _write_json_atomic(run_file, run_key)


def _valid_marker(tmp: Path, sh: ShardPlan) -> dict | None:
    """The shard's done-marker if its input is unchanged and its output is intact (size and CRC-32)."""
    path = tmp / ".done" / f"{sh.name}.json"
    try:
        marker = json.loads(path.read_text())
        out = tmp / sh.name
        if (marker["input"] == sh.fingerprint and out.stat().st_size == marker["output"]["size"]
                and file_crc32(out) == marker["output"]["crc32"]):
            return marker
    except (OSError, ValueError, KeyError, TypeError):
        pass
    path.unlink(missing_ok=True)
    return None


def _write_json_atomic(path: Path, obj) -> None:
    part = path.with_name(path.name + ".tmp")
    part.write_text(json.dumps(obj, indent=1))
    os.replace(part, path)


def quantization_config(fmt: FP8Format, pow2_scale: bool, block_size: int = BLOCK_SIZE, v4: bool = False) -> dict:
    """config.json's `quantization_config` (DeepSeek-V3 convention; a DeepSeek-V4 also states its scale format).

    vLLM reads `scale_fmt: ue8m0` only to turn on DeepGEMM's UE8M0 path (transformers_utils/config.py); the
    dtype of its DeepSeek-V4 scale parameters follows `expert_dtype` instead (FP32 for FP8 experts)."""
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [block_size, block_size]}
    if pow2_scale or v4:
        qc["scale_fmt"] = "ue8m0" if pow2_scale else None  # DeepSeek-V3.1+/V4 spelling for power-of-two scales
    if fmt.name == "e4m3fnuz":
        # Not read by vLLM (which loads e4m3fn and converts on ROCm itself): marks tensors stored as fnuz.
        qc["fp8_dtype"] = "float8_e4m3fnuz"
    return qc


def output_config(config: dict, fmt: FP8Format, mode: str, opts: ConvertOptions) -> dict:
    """The converted folder's config.json. A DeepSeek-V4 gets the release's keys (an input in transformers'
    layout has them rewritten) and the top-level ``expert_dtype: "fp8"``: vLLM reads it from there and takes a
    missing one as "fp4", which would send FP8 experts down its MXFP4 path."""
    if mode == FN_TO_FNUZ:
        return {**config, "quantization_config": {**config["quantization_config"], "fp8_dtype": "float8_e4m3fnuz"}}
    v4 = is_deepseek_v4(config)
    qc = quantization_config(fmt, opts.pow2_scale, opts.block_size, v4=v4)
    if not v4:
        return {**config, "quantization_config": qc}
    if "compress_ratios" not in config:  # transformers' keys: the input was in its in-memory layout
        from transformers import DeepseekV4Config

        from repro.model.release_config import release_config

        config = release_config(DeepseekV4Config(**{k: v for k, v in config.items() if k not in ("architectures",
                                "model_type", "transformers_version")}), torch_dtype="bfloat16")
    return {**config, "quantization_config": qc, "expert_dtype": "fp8"}


def _finalize(src: Path, dst: Path, tmp: Path, config: dict, shards: list[ShardPlan], fmt: FP8Format, mode: str,
              opts: ConvertOptions, stats: list[TensorStats]) -> None:
    weight_map = {name: sh.name for sh in shards for name, _, _ in sh.outputs}
    total_size = sum(
        int(torch.Size(shape).numel()) * dtype.itemsize for sh in shards for _, dtype, shape in sh.outputs
    )
    _write_json_atomic(tmp / INDEX, {"metadata": {"total_size": total_size},
                                     "weight_map": dict(sorted(weight_map.items()))})
    _write_json_atomic(tmp / CONFIG, output_config(config, fmt, mode, opts))
    for path in src.iterdir():  # tokenizer, generation config, chat template, licence...
        if (path.is_file() and path.name != CONFIG and not path.name.startswith(".")
                and not path.name.endswith(_WEIGHT_FILES)):
            shutil.copy2(path, tmp / path.name)
    report = {"source": str(src.resolve()), "mode": mode, "options": asdict(opts), "format": fmt.name,
              "summary": summarise(stats), "tensors": [s.to_dict() for s in stats]}
    _write_json_atomic(tmp / REPORT, report)
    shutil.rmtree(tmp / ".done")
    (tmp / ".run.json").unlink()
    if opts.fsync:  # the small files too, and the folder, before the rename makes it look complete
        for path in tmp.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        dir_fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    if dst.exists():  # overwrite (of a conversion: checked first): the old one aside only now the new one is whole
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.rename(dst, old)  # over the empty folder just made: a name no one else holds
        os.rename(tmp, dst)
        shutil.rmtree(old)
    else:
        os.rename(tmp, dst)
