"""AMD's published numbers as data: exact values, and each number appears in the sentence it came from."""

from repro.reference import amd_facts, amd_reference, amd_value


def test_published_values():
    expected = {
        "reward_acc_phase1": 0.45, "reward_acc_phase2": 0.53, "reward_acc_phase3": 0.59,
        "reward_acc_step_min": 0.266, "reward_acc_step_max": 0.777,
        "aime_avg8_start": 0.300, "aime_avg8_end": 0.492, "aime_num_problems": 30, "aime_samples_per_problem": 8,
        "rollout_tokens_per_s_mean": 311.0, "rollout_tokens_per_s_min": 287.0, "rollout_tokens_per_s_max": 331.0,
        "rollout_tokens_per_s_first_third": 315.2, "rollout_tokens_per_s_last_third": 308.6, "rollout_gpus": 8,
        "kl_train_rollout_step75": 0.4706, "ess_step75": 0.791, "steps": 75, "checkpoint_every_steps": 25,
        "trajectories_per_step": 256, "tis_cap": 2.0, "total_parameters": 284e9, "active_parameters": 13e9, "gpus": 24,
    }
    assert {k: r.value for k, r in amd_reference().items()} == expected
    assert amd_reference()["reward_acc_phase2"].steps == (26, 50)
    assert amd_reference()["aime_avg8_end"].step == 75
    assert amd_value("rollout_tokens_per_s_mean") / amd_value("rollout_gpus") == 38.875


def _spellings(value: float, key: str) -> set[str]:
    """How the source may write the number: 30.0% or 45%, 284 (billion), eight, 0.4706."""
    if key.startswith(("reward_acc", "aime_avg8", "ess")):
        exact = f"{value * 100:.1f}%"
        return {exact, exact.replace(".0%", "%")}
    if key in ("total_parameters", "active_parameters"):
        return {str(int(value // 1e9))}
    if key == "aime_samples_per_problem":
        return {"eight"}
    return {f"{value:g}"}


def test_each_number_is_in_its_quote():
    refs = amd_reference()
    missing = [k for k, r in refs.items() if not any(s in r.quote for s in _spellings(r.value, k))]
    assert missing == ["rollout_gpus"]  # the node's 8 GPUs are stated elsewhere in the post, not in this quote


def test_run_facts():
    facts = amd_facts()
    assert (facts["run_start"], facts["run_end"], facts["rocm"], facts["vllm"]) == \
        ("2026-08-17", "2026-08-21", "7.2", "0.25.1")
    assert "August 17 to 21, 2026" in facts["run_dates_quote"]
