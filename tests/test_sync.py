"""Weight sync: bucket packing, the checks on arrival, the sync's gloo group, and one test per fault showing
the engine refuses to generate from a half-applied update until a complete sync succeeds."""

import dataclasses
import threading

import pytest
import torch

from repro.model.tiny import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from repro.rollout.embedded import EmbeddedEngine, RolloutError
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.types import SamplingParams
from repro.sync.apply import apply_stream
from repro.sync.errors import SyncError
from repro.sync.stream import BucketHeader, pack_buckets, payload_checksum, unpack, verified_stream
from repro.sync.group import free_address, receive_all, SyncAddress, SyncGroup

PARAMS = SamplingParams(n=1, max_new_tokens=3, seed=1)
PROMPT = [[BOS_TOKEN_ID, 5, 10]]


def named():
    # 400 B, 400 B, 1200 B, 8 B (float32)
    return [("a", torch.arange(100.0)), ("b", torch.ones(100)), ("c", torch.zeros(300)),
            ("d", torch.tensor([1.0, 2.0]))]


def test_bucket_boundaries_follow_the_byte_cap_and_each_stream_ends_with_a_marker():
    buckets = list(pack_buckets(named(), bucket_bytes=848, version=3, sender=1))
    assert [[e.name for e in b.header.entries] for b in buckets] == [["a", "b"], ["c"], ["d"], []]
    assert [b.header.nbytes for b in buckets] == [848, 1200, 8, 0]  # b starts at 448: offsets are 64-aligned
    assert [(b.header.index, b.header.end) for b in buckets] == [(0, False), (1, False), (2, False), (3, True)]
    assert {(b.header.version, b.header.sender) for b in buckets} == {(3, 1)}
    assert [(e.offset, e.nbytes, e.shape, e.dtype) for e in buckets[0].header.entries] == [
        (0, 400, (100,), "float32"), (448, 400, (100,), "float32")]
    assert torch.equal(buckets[0].payload[400:448], torch.zeros(48, dtype=torch.uint8))
    assert [[e.name for e in b.header.entries] for b in pack_buckets(named(), 847, 3)][:2] == [["a"], ["b"]]
    assert len(list(pack_buckets(named(), bucket_bytes=10**9, version=0))) == 2
    with pytest.raises(SyncError, match="bucket size must be positive"):
        next(pack_buckets(named(), 0, 1))


def test_checksum_values_by_hand_and_the_header_is_json():
    # struct.pack("<f", 1.0) == 00 00 80 3F: shorter than a word, so the byte sum 0x80 + 0x3F; no whole block
    bucket = next(pack_buckets([("x", torch.tensor([1.0]))], 64, version=2))
    assert bucket.header.checksum == 191 == payload_checksum(bucket.payload)
    # two whole blocks of 512 int64 words (all 1, then all 2), one more word (3), two last bytes (5, 7):
    # plain 512 + 1024 + 3 + 12, weighted 512 * 1 + 1024 * 2
    words = torch.cat([torch.ones(512), torch.full((512,), 2.0), torch.tensor([3.0])]).to(torch.int64)
    payload = torch.cat([words.view(torch.uint8), torch.tensor([5, 7], dtype=torch.uint8)])
    assert payload_checksum(payload) == (2560 << 64) | 1551
    swapped = torch.cat([payload[4096:8192], payload[:4096], payload[8192:]])  # the two blocks swapped
    assert payload_checksum(swapped) == (2048 << 64) | 1551
    assert payload_checksum(torch.full((8,), 0xFF, dtype=torch.uint8)) == (1 << 64) - 1  # word -1, mod 2^64
    assert payload_checksum(torch.tensor([1 << 62] * 4).view(torch.uint8)) == 0  # 2^64 wraps to 0
    assert payload_checksum(payload[1:]) == payload_checksum(payload[1:].clone())  # a misaligned start: a copy
    assert payload_checksum(torch.empty(0, dtype=torch.uint8)) == 0
    assert BucketHeader.decode(bucket.header.encode(), "test") == bucket.header
    with pytest.raises(SyncError, match="test: unreadable bucket header"):
        BucketHeader.decode(b'{"version": 1}', "test")


def test_a_flipped_bit_anywhere_changes_the_checksum():
    payload = torch.randint(0, 256, (3 * 8192 + 7,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    reference = payload_checksum(payload)
    for position in (0, 1, 8191, 8192, 20000, payload.numel() - 1):
        for bit in (0, 7):
            flipped = payload.clone()
            flipped[position] ^= 1 << bit
            assert payload_checksum(flipped) != reference, (position, bit)


def test_round_trip_is_bit_exact_in_every_dtype():
    tensors = [("bf", torch.randn(3, 5).bfloat16()), ("f32", torch.randn(7)), ("i64", torch.arange(5)),
               ("fp8", torch.randn(2, 2).to(torch.float8_e4m3fn))]
    out = [pair for _, pairs in verified_stream(pack_buckets(tensors, 40, version=1), 1, 1) for pair in pairs]
    assert [n for n, _ in out] == [n for n, _ in tensors]
    for (_, a), (_, b) in zip(tensors, out):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _flip_byte(bucket):
    payload = bucket.payload.clone()
    payload[3] ^= 1
    return dataclasses.replace(bucket, payload=payload)


FAULTS = {
    "lost bucket": (lambda bs: bs[:1] + bs[2:], "bucket 1 of sender 0: got bucket 2 of sender 0 of v5 instead"),
    "bad checksum": (lambda bs: [bs[0], _flip_byte(bs[1])] + bs[2:],
                     "bucket 1 of sender 0: payload fails its checksum"),
    "stream cut": (lambda bs: bs[:2], "bucket 2 of sender 0: the stream ended before it arrived"),
    "old version": (lambda bs: [dataclasses.replace(bs[0], header=dataclasses.replace(bs[0].header, version=4))]
                    + bs[1:],
                    "bucket 0 of sender 0: got bucket 0 of sender 0 of v4 instead"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_bad_streams_are_refused_naming_the_bucket(fault):
    damage, message = FAULTS[fault]
    with pytest.raises(SyncError, match=f"weight sync v5: {message}"):
        list(verified_stream(damage(list(pack_buckets(named(), 800, version=5))), 5, 1))


def test_a_tensor_sent_twice_is_refused():
    twice = list(pack_buckets(named()[:1], 800, 1)) + list(pack_buckets(named()[:1], 800, 1, sender=1))
    with pytest.raises(SyncError, match="bucket 0 of sender 1: tensor a arrived twice"):
        list(verified_stream(twice, 1, 2))


# -- the engine's promise ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0)


def _policy(model, scale):
    return [(n, (t * scale).to(t.dtype) if t.is_floating_point() else t.clone()) for n, t in model.state_dict().items()]


def _bucketed(weights, version):
    return list(pack_buckets(weights, 64 * 1024, version))  # the tiny model in several buckets


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failed_sync_leaves_the_engine_refusing_until_a_full_sync(model, fault):
    engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)
    damage, message = FAULTS[fault]
    buckets = _bucketed(_policy(model, 1.5), version=5)
    assert len(buckets) > 3
    with pytest.raises(SyncError, match=message):
        apply_stream(engine, damage(buckets), version=5)
    with pytest.raises(RolloutError, match=f"generate refused: weight sync v5 failed .*{message}"):
        engine.generate(PROMPT, PARAMS)
    stats = apply_stream(engine, _bucketed(_policy(model, 1.5), version=6), version=6)
    assert engine.weight_version == 6 and stats.buckets == len(buckets) - 1
    assert engine.generate(PROMPT, PARAMS).trajectories[0].weight_version == 6


def test_a_sync_missing_a_tensor_or_carrying_a_bad_one_fails_and_refuses(model):
    engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)
    partial = [(n, t) for n, t in model.state_dict().items() if n != "model.norm.weight"]
    with pytest.raises(RolloutError, match=r"v3: the sync ended without tensors \['model.norm.weight'\]"):
        apply_stream(engine, _bucketed(partial, 3), version=3)
    with pytest.raises(RolloutError, match="weight sync v3 failed"):
        engine.generate(PROMPT, PARAMS)
    shaped = [(n, torch.zeros(3, 3) if n == "lm_head.weight" else t) for n, t in model.state_dict().items()]
    with pytest.raises(RolloutError, match=r"v4: tensor lm_head.weight has shape \(3, 3\)"):
        apply_stream(engine, _bucketed(shaped, 4), version=4)
    with pytest.raises(RolloutError, match=r"weight sync v4 failed \(weight sync v4, bucket \d+ of sender 0"):
        engine.generate(PROMPT, PARAMS)


def test_streamed_sync_is_bit_identical_to_the_whole_model_update(model):
    """Bucket by bucket (FP8 view per module tensor) == the old all-at-once update; and with the BF16 view the
    served weights are the sent ones bit for bit."""
    view = FP8WeightView("e4m3fn", 128)
    weights = _policy(model, 0.75)
    whole = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32, weight_view=view)
    whole.update_weights(weights, version=1)
    streamed = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32, weight_view=view)
    apply_stream(streamed, _bucketed(weights, 1), version=1)
    for (name, a), b in zip(whole.model.state_dict().items(), streamed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    plain = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)
    apply_stream(plain, _bucketed(weights, 2), version=2)
    served = plain.model.state_dict()
    assert all(torch.equal(served[n], t) for n, t in weights)


# -- over the sync's own gloo group --------------------------------------------------------------------------------


def _address(receivers, timeout_s=30.0):
    host, port = free_address("127.0.0.1")
    return SyncAddress(host, port, sender=0, receivers=receivers, timeout_s=timeout_s)


def test_two_receivers_get_the_senders_tensors_bit_for_bit_over_gloo():
    tensors = [(f"w{i}", torch.randn(300 + i).bfloat16()) for i in range(20)]
    address, got = _address(receivers=2), {}

    def receive(rank):
        group = SyncGroup(address, rank)
        got[rank] = [(n, t.clone()) for _, ts in verified_stream(receive_all([group], 9), 9, 1) for n, t in ts]

    threads = [threading.Thread(target=receive, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    sent = SyncGroup(address, 0).send(pack_buckets(tensors, 2048, version=9))
    for t in threads:
        t.join(60)
    assert sent == sum(b.header.nbytes for b in pack_buckets(tensors, 2048, version=9)) > \
        sum(t.numel() * 2 for _, t in tensors)
    for rank in (1, 2):
        assert [n for n, _ in got[rank]] == [n for n, _ in tensors]
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for (_, a), (_, b) in zip(got[rank], tensors))


def test_a_dead_sender_fails_the_sync_naming_the_bucket(model):
    """The sender stops after bucket 0 (it died, or stalls past the group's timeout): the engine refuses."""
    address = _address(receivers=1, timeout_s=3.0)
    engine = EmbeddedEngine(model, EOS_TOKEN_ID, PAD_TOKEN_ID, max_context=32)
    buckets = _bucketed(_policy(model, 2.0), 4)
    sender = threading.Thread(target=lambda: SyncGroup(address, 0).send(buckets[:1]))
    sender.start()
    with pytest.raises(SyncError, match="weight sync v4: bucket 1 of sender 0: the transport failed"):
        apply_stream(engine, receive_all([SyncGroup(address, 1)], 4), version=4)
    sender.join(30)
    with pytest.raises(RolloutError, match="weight sync v4 failed .*bucket 1 of sender 0"):
        engine.generate(PROMPT, PARAMS)


def test_unpack_refuses_an_entry_outside_its_payload():
    bucket = next(pack_buckets(named()[:1], 800, 1))
    entry = dataclasses.replace(bucket.header.entries[0], nbytes=4000)
    bad = dataclasses.replace(bucket, header=dataclasses.replace(bucket.header, entries=(entry,)))
    with pytest.raises(SyncError, match="bucket 0 of sender 0: tensor a .* does not fit its 400-byte payload"):
        unpack(bad)
