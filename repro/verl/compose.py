"""Overrides -> the config verl will run, composed and checked by verl's own code before anything starts.

``compose_config`` is what ``python -m verl.trainer.main_ppo`` does first: Hydra's ``compose()`` of verl's
``ppo_trainer`` with the overrides (a key verl lacks, a wrong group, a value its grammar refuses: an error here), then
``verl.utils.config.validate_config`` as ``main`` calls it. ``runtime_problems`` checks, with verl's own functions
where it has them, what verl 0.9.1 only finds once the job runs (measured on the wheel: compose and validate pass
all of these): an unknown advantage estimator (``get_adv_estimator_fn``), an unknown ``rollout_is`` level or a bad
threshold (``rollout_corr_helper``'s parser), a logprobs mode vLLM does not have, a number that is not one (verl's
``McoreOptimizerConfig`` dataclass), a dual-clip constant <= 1 (the assertion in ``core_algos``), a logger name
``Tracking`` does not support, and ``override_optimizer_config`` keys megatron's ``OptimizerConfig`` does not have.

Needs verl (and its Hydra) importable: the verl image on a cluster, ``.venv-verl`` here (``make test-verl``).
Without it, ``verl_available()`` is False and the run refuses to start (the dry run says the config was not composed).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from repro.errors import ReproError

CONFIG_NAME = "ppo_trainer"
# vLLM's LogprobsMode values (vllm/config/model.py); vLLM itself is not needed to compose, so it may be absent here
VLLM_LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


class VerlConfigError(ReproError):
    """verl would refuse this config (at compose, validation or later, at run time); the message names each key."""


def verl_available() -> bool:
    return importlib.util.find_spec("verl") is not None and importlib.util.find_spec("hydra") is not None


def config_dir() -> Path:
    spec = importlib.util.find_spec("verl.trainer")
    return Path(list(spec.submodule_search_locations)[0]) / "config"


def compose_config(overrides: list[str]):
    """verl's composed ``ppo_trainer`` config with ``overrides``, validated as verl's ``main`` validates it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf.errors import OmegaConfBaseException

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            config = compose(config_name=CONFIG_NAME, overrides=list(overrides))
    except Exception as err:  # hydra's errors (ConfigCompositionException, OverrideParseException, ...)
        raise VerlConfigError(f"verl cannot compose these overrides: {_first_line(err)}") from None
    finally:
        GlobalHydra.instance().clear()
    try:
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except (AssertionError, ValueError, TypeError, OmegaConfBaseException) as err:
        raise VerlConfigError(f"verl's validate_config refuses the config: {_first_line(err)}") from None
    return config


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    cause = err.__cause__ or err.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text += f" ({str(cause).strip().splitlines()[0]})"
    return text.splitlines()[0] if len(text.splitlines()) < 3 else " ".join(text.split())[:600]


def runtime_problems(config) -> list[str]:
    """What verl 0.9.1 would fail on only after starting, one ``key: why`` line each (module docstring)."""
    problems: list[str] = []
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    problems += _check("algorithm.adv_estimator", _adv_estimator, config.algorithm.adv_estimator)
    correction = config.algorithm.get("rollout_correction")
    if correction is not None and correction.get("rollout_is") is not None:
        problems += _check("algorithm.rollout_correction", _rollout_is, correction.rollout_is,
                           correction.rollout_is_threshold)
    if rollout.logprobs_mode not in VLLM_LOGPROBS_MODES:
        problems.append(f"actor_rollout_ref.rollout.logprobs_mode: {rollout.logprobs_mode!r} is not one of vLLM's "
                        f"{', '.join(VLLM_LOGPROBS_MODES)}")
    problems += _check("actor_rollout_ref.actor.optim", _optimizer_dataclass, actor.optim)
    problems += _check("actor_rollout_ref.actor.clip_ratio_c", _dual_clip, actor.clip_ratio_c)
    problems += _check("trainer.logger", _loggers, config.trainer.logger)
    overrides = actor.optim.get("override_optimizer_config") or {}
    problems += _check("actor_rollout_ref.actor.optim.override_optimizer_config", _megatron_optimizer_keys,
                       list(overrides))
    return problems


def _check(key: str, check, *args) -> list[str]:
    try:
        check(*args)
    except Exception as err:  # each check raises what verl would raise later; name the key it came from
        return [f"{key}: {_first_line(err)}"]
    return []


def _adv_estimator(name: str) -> None:
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    get_adv_estimator_fn(name)


def _rollout_is(level: Any, threshold: Any) -> None:
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

    if level not in ("token", "sequence"):  # compute_rollout_correction_weights' levels
        raise ValueError(f"rollout_is {level!r} is not token or sequence (verl's IS levels)")
    _parse_rollout_is_threshold(threshold)


def _optimizer_dataclass(optim) -> None:
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import McoreOptimizerConfig

    plain = OmegaConf.to_container(optim, resolve=True)
    plain.pop("_target_", None)
    omega_conf_to_dataclass(plain, McoreOptimizerConfig)


def _dual_clip(value: Any) -> None:
    if not float(value) > 1.0:  # core_algos: "The lower bound of the clip_ratio_c for dual-clip PPO should be > 1"
        raise ValueError(f"dual-clip constant {value!r} must be greater than 1.0 (verl asserts it in the loss)")


def _loggers(names) -> None:
    from verl.utils.tracking import Tracking

    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in Tracking.supported_backend]
    if unknown:
        raise ValueError(f"{unknown} not among verl's loggers {Tracking.supported_backend}")


def megatron_optimizer_fields() -> set[str] | None:
    """megatron-core's ``OptimizerConfig`` field names (None: megatron-core is not importable here)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return None
    from megatron.core.optimizer import OptimizerConfig

    return {f.name for f in dataclasses.fields(OptimizerConfig)}


def _megatron_optimizer_keys(keys: list[str]) -> None:
    fields = megatron_optimizer_fields()
    if fields is None:
        return  # checked where megatron-core is (the image, the verl lane); the dry run says when it was not
    unknown = sorted(set(keys) - fields)
    if unknown:
        raise ValueError(f"{unknown} are not fields of megatron-core's OptimizerConfig, which verl builds with "
                         "them (a TypeError once the trainer starts)")


def check_config(overrides: list[str]):
    """Compose, validate, and refuse what only the run would find: the config verl will run."""
    config = compose_config(overrides)
    problems = runtime_problems(config)
    if problems:
        raise VerlConfigError("verl would stop on this config after starting:\n  " + "\n  ".join(problems))
    return config


def write_composed(config, path: Path, header: str) -> Path:
    """The composed config as YAML (interpolations kept, as verl sees them) under a comment header; temp, rename."""
    from omegaconf import OmegaConf

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    tmp.write_text(comment + OmegaConf.to_yaml(config))
    tmp.replace(path)
    return path


def flat(config) -> dict[str, Any]:
    """The composed config as {dotted key: value}, resolved, for diffs."""
    from omegaconf import OmegaConf

    def walk(node, prefix, out):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.", out)
        else:
            out[prefix[:-1]] = node
        return out

    return walk(OmegaConf.to_container(config, resolve=False), "", {})
