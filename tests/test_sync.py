"""Weight sync: bucket boundaries, checksums, and that a bad set never reaches the engine."""

import dataclasses

import pytest
import torch

from repro.sync import SyncError, apply_buckets, make_buckets, tensor_crc32, verified_tensors


def named():
    # 400 B, 400 B, 1200 B, 8 B (float32)
    return [("a", torch.arange(100.0)), ("b", torch.ones(100)), ("c", torch.zeros(300)), ("d", torch.tensor([1.0, 2.0]))]


class RecordingEngine:
    def __init__(self):
        self.updates = []

    def update_weights(self, named_tensors, version):
        self.updates.append((version, [n for n, _ in named_tensors]))


def test_bucket_boundaries_follow_the_byte_cap():
    buckets = make_buckets(named(), bucket_bytes=800, version=3)
    assert [list(b.tensors) for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert [b.nbytes for b in buckets] == [800, 1200, 8]
    assert {(b.version, b.count) for b in buckets} == {(3, 3)}
    assert len(make_buckets(named(), bucket_bytes=10**9, version=0)) == 1
    with pytest.raises(SyncError, match="bucket size must be positive"):
        make_buckets(named(), 0, 1)


def test_crc_is_of_the_bytes():
    # zlib.crc32(struct.pack("<f", 1.0)) computed independently: the CRC covers the raw little-endian bytes
    assert tensor_crc32(torch.tensor([1.0])) == 0xACA16A6A == tensor_crc32(torch.tensor([1065353216], dtype=torch.int32))
    assert tensor_crc32(torch.tensor([1.0], dtype=torch.bfloat16)) != tensor_crc32(torch.tensor([1.0]))


def test_complete_set_reaches_the_engine_once():
    engine = RecordingEngine()
    buckets = make_buckets(named(), 800, version=7)
    stats = apply_buckets(engine, list(reversed(buckets)), version=7)
    assert engine.updates == [(7, ["a", "b", "c", "d"])]
    assert (stats.buckets, stats.tensors, stats.nbytes) == (3, 4, 2008) and stats.gbps > 0


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda bs: bs[:2], r"expected buckets 0..2, got indices \[0, 1\]"),
        (lambda bs: bs + [bs[0]], r"expected buckets 0..2, got indices \[0, 0, 1, 2\]"),
        (lambda bs: [dataclasses.replace(bs[0], version=6)] + bs[1:], "bucket 0 belongs to v6"),
        (lambda bs: [bs[0], dataclasses.replace(bs[1], tensors={"c": torch.ones(300)}), bs[2]],
         "tensor c in bucket 1 fails its checksum"),
        (lambda bs: [bs[0], dataclasses.replace(bs[1], tensors={"a": bs[0].tensors["a"]}, checksums={"a": bs[0].checksums["a"]}), bs[2]],
         "tensor a arrived twice"),
        (lambda bs: [dataclasses.replace(bs[0], checksums={"a": 1})] + bs[1:], "bucket 0 lists 1 checksums for 2 tensors"),
        (lambda bs: [], "no buckets arrived"),
    ],
)
def test_bad_sets_never_reach_the_engine(damage, message):
    engine = RecordingEngine()
    with pytest.raises(SyncError, match=message):
        apply_buckets(engine, damage(make_buckets(named(), 800, version=7)), version=7)
    assert engine.updates == []


def test_verified_order_is_the_sender_order():
    buckets = make_buckets(named(), 400, version=1)
    assert [n for n, _ in verified_tensors(buckets[::-1], 1)] == ["a", "b", "c", "d"]
