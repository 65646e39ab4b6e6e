"""The SFT warm start: loss only on response + EOS, bit-identical weights for one seed, loss going down."""

import torch

from repro.data.tinymath import Arithmetic
from repro.model.tiny import build_tiny_model
from repro.model.tokenizer import build_tiny_tokenizer
from repro.model.warmstart import IGNORE, WarmStartConfig, deterministic_setup, sft_batch, train_steps


def test_sft_batch_masks_prompt_and_padding():
    tokenizer = build_tiny_tokenizer()
    input_ids, labels = sft_batch([Arithmetic(37, "+", 5), Arithmetic(9, "-", 9)], tokenizer)
    assert tokenizer.decode(input_ids[0]) == "<bos>37+05=Answer: 42<eos>"
    assert tokenizer.decode(input_ids[1]) == "<bos>09-09=Answer: 0<eos><pad>"
    assert (labels[:, :7] == IGNORE).all() and labels[1, -1] == IGNORE
    assert tokenizer.decode(labels[0, 7:]) == "Answer: 42<eos>"


def test_five_steps_twice_give_identical_weights_and_the_loss_falls():
    before = torch.get_num_threads()
    config = WarmStartConfig(batch_size=32)
    tokenizer = build_tiny_tokenizer()
    runs = []
    try:
        for _ in range(2):
            deterministic_setup(config.threads)
            model = build_tiny_model(config.seed)
            state = train_steps(model, tokenizer, config, 5)
            runs.append((model.state_dict(), state["losses"]))
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)
    (weights_a, losses_a), (weights_b, losses_b) = runs
    assert losses_a == losses_b
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert losses_a[-1] < losses_a[0] - 0.2
