"""The streaming safetensors writer: O_DIRECT through a page-aligned staging buffer, streamed prefixes, and the
page-cache fallbacks (the file's tail, a file system that refuses O_DIRECT at open or at the first write) all
give the same bytes, a file the safetensors library loads, and the CRC-32 of what is on disk."""

import errno
import os
import zlib

import pytest
import torch
from safetensors import safe_open

import repro.fp8.safetensors_io as sio
from repro.fp8.safetensors_io import StreamingWriter, file_crc32


def _tensors():
    g = torch.Generator().manual_seed(5)
    return [
        ("a.weight", torch.randn(300, 70, generator=g).to(torch.bfloat16)),  # 42,000 bytes: ends mid-stage
        ("a.weight_scale_inv", torch.rand(3, 1, generator=g)),
        ("b.weight", (torch.randn(129, 257, generator=g) * 50).to(torch.float8_e4m3fnuz)),
        ("empty", torch.zeros(0, 4)),
        ("c.bias", torch.arange(7, dtype=torch.int64)),
    ]


def _write(path, direct, fsync=False):
    tensors = _tensors()
    writer = StreamingWriter(path, [(n, t.dtype, tuple(t.shape)) for n, t in tensors], direct=direct)
    opened_direct = writer.direct
    for name, t in tensors:
        writer.write(name, t)
        t.zero_()  # the caller may reuse the memory as soon as write returns (staging copied it)
    return writer.close(fsync=fsync), opened_direct


@pytest.fixture(autouse=True)
def small_stages(monkeypatch):
    monkeypatch.setattr(sio, "STAGE_BYTES", 8192)  # many full staging buffers and an unaligned tail


def test_direct_and_buffered_writes_give_the_same_loadable_file(tmp_path):
    crc_direct, opened_direct = _write(tmp_path / "direct.safetensors", direct=True, fsync=True)
    crc_buffered, opened_buffered = _write(tmp_path / "buffered.safetensors", direct=False)
    assert opened_buffered is False
    if hasattr(os, "O_DIRECT"):
        assert opened_direct is True  # pytest's tmp_path is on a disk file system here
    raw = (tmp_path / "direct.safetensors").read_bytes()
    assert raw == (tmp_path / "buffered.safetensors").read_bytes()
    assert crc_direct == crc_buffered == f"{zlib.crc32(raw):08x}" == file_crc32(tmp_path / "direct.safetensors")
    assert len(raw) > 6 * 8192 and len(raw) % 4096  # several stages, and a tail that is not whole blocks
    with safe_open(tmp_path / "direct.safetensors", "pt") as f:
        assert list(f.keys()) == sorted(n for n, _ in _tensors())
        for name, want in _tensors():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_a_file_system_that_refuses_o_direct_writes_gets_buffered_writes(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_write, refused = os.write, []

    def write(fd, data):  # as on a file system that accepts O_DIRECT at open but not at write
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(sio.os, "write", write)
    crc, _ = _write(tmp_path / "x.safetensors", direct=True)
    monkeypatch.setattr(sio.os, "write", real_write)
    crc_ref, _ = _write(tmp_path / "ref.safetensors", direct=False)
    assert refused == [8192]  # the first direct write, then none
    assert crc == crc_ref and (tmp_path / "x.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_short_direct_writes_continue_correctly(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(sio.os, "write", lambda fd, data: real_write(fd, data[: max(1, len(data) // 3)]))
    crc, _ = _write(tmp_path / "short.safetensors", direct=True)
    monkeypatch.setattr(sio.os, "write", real_write)
    crc_ref, _ = _write(tmp_path / "ref.safetensors", direct=False)
    assert crc == crc_ref and \
        (tmp_path / "short.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_a_write_error_surfaces_and_abort_closes_the_file(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    tensors = _tensors()
    writer = StreamingWriter(tmp_path / "w.safetensors", [(n, t.dtype, tuple(t.shape)) for n, t in tensors])
    monkeypatch.setattr(sio.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        for name, t in tensors:
            writer.write(name, t)
        writer.close()
    writer.abort()
    writer.abort()  # twice is harmless


@pytest.mark.parametrize("threads,in_place", [(1, False), (3, True), (1, True)])
def test_on_ready_reports_final_prefixes_in_order(monkeypatch, threads, in_place):
    import repro.fp8.quant as quant

    monkeypatch.setattr(quant, "_CPU_SLAB_ELEMS", 1 << 15)  # many slabs

    monkeypatch.setattr(quant, "_FUSED_SLAB_FACTOR", 1)
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(2, 300, 256, generator=g) * 0.02).to(torch.bfloat16)  # a partial block-row in each expert
    ref, _, _ = quant.quantize_block_with_error(w.clone(), "e4m3fnuz")
    seen = []
    q, _, _ = quant.quantize_block_with_error(w, "e4m3fnuz", threads=threads, overwrite_input=in_place,
                                              on_ready=lambda flat, n: seen.append((n, flat[:n].clone())))
    ends = [n for n, _ in seen]
    assert ends == sorted(ends) and ends[-1] == w.numel() and len(ends) > 4
    final = ref.reshape(-1).view(torch.uint8)
    for n, prefix in seen:  # what was reported ready was already the final bytes
        assert torch.equal(prefix.view(torch.uint8), final[:n])
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))


def test_streamed_and_written_tensors_give_the_same_file(tmp_path):
    tensors = _tensors()
    plan = [(n, t.dtype, tuple(t.shape)) for n, t in tensors]
    plain = StreamingWriter(tmp_path / "plain.safetensors", plan)
    for name, t in tensors:
        plain.write(name, t)
    streamed = StreamingWriter(tmp_path / "streamed.safetensors", plan)
    for name, t in tensors:
        flat = t.reshape(-1)
        for n in (flat.numel() // 3, flat.numel() // 3, flat.numel() // 2):  # repeated and growing prefixes
            streamed.stream(name, flat, n)
        streamed.write(name, t)
    assert plain.close() == streamed.close()
    assert (tmp_path / "plain.safetensors").read_bytes() == (tmp_path / "streamed.safetensors").read_bytes()
    bad = StreamingWriter(tmp_path / "bad.safetensors", plan)
    with pytest.raises(RuntimeError, match="streamed tensor out of plan"):
        bad.stream("b.weight", tensors[2][1].reshape(-1), 10)
    bad.abort()


def test_a_file_system_that_refuses_o_direct_at_open_gets_a_plain_file(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_open = os.open

    def open_(path, flags, mode=0o777):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(sio.os, "open", open_)
    crc, opened_direct = _write(tmp_path / "x.safetensors", direct=True)
    monkeypatch.setattr(sio.os, "open", real_open)
    crc_ref, _ = _write(tmp_path / "ref.safetensors", direct=False)
    assert opened_direct is False
    assert crc == crc_ref and (tmp_path / "x.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
