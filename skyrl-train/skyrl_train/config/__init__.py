"""Typed run configuration: one flat dataclass per component, a YAML file plus ``a.b=c`` overrides.

The root :class:`Config` has exactly two levels, ``section.field``; a field may hold a list or a free-form
mapping (``environment.env_configs``). Every section is a frozen dataclass, so a config is a value: build a new
one with :func:`dataclasses.replace` or :func:`load_config`.

Life of a config::

    config = load_config("run.yaml", ["trainer.train_batch_size=64", "generator.temperature=0.7"])
    config = resolve(config)           # the ONE place derived values (``None`` = "derive me") are filled in
    validate(config)                   # every bad input at once, before any model is loaded
    record_config(config, run_dir)     # print the resolved YAML and save it as {run_dir}/config.yaml
    parts = skyrl_train.wiring.components_of(config, total_steps=...)   # every component's settings

Sections and the components they feed (components take their own arguments, never this root config;
``skyrl_train.wiring`` is the one place that maps the sections onto them):

=================  ============================================================================================
``data``           ``data.PromptDataset`` (files, ``max_prompt_length``) and ``data.PromptLoader`` (seed, shuffle)
``model``          ``backends.config.BackendConfig`` (dtype, checkpointing) + ``LoraConfig`` (``lora_*``); the
                   reference and critic models; ``dtype`` also sets the local and vLLM engines' dtype
``optim``          ``backends.config.OptimizerConfig`` (``adam_betas`` → ``betas``)
``algorithm``      ``AdvantageConfig`` + estimator name, ``PolicyLossConfig`` + loss name, KL, entropy, DAPO filters
``off_policy``     ``algorithms.OffPolicyCorrectionConfig`` itself (referenced, not copied)
``generator``      ``generators.skyrl_gym_generator.GeneratorConfig`` and the ``SamplingParams`` of rollouts;
                   ``factory``/``factory_kwargs``: ``generators.factory.FactorySettings`` (another generator)
``inference``      ``inference.factory.create_engine`` (local torch, vLLM or a remote OpenAI-compatible server)
``ray``            ``ray_cluster.ensure_ray``: the cluster to join (``address``) when some role runs in actors
``trainer``        the loop: batch sizes, epochs, evaluation, checkpoints, exports, resume, logging;
                   micro-batching and ``seed`` also go to ``BackendConfig``, ``seed`` to the engine too
``environment``    default env class; ``env_configs`` and ``max_env_workers`` go to ``GeneratorConfig``
=================  ============================================================================================

Modules, each importing only the ones above it:

- ``schema``: the sections (keys, types, defaults, a comment on each), :class:`ConfigError`, removed keys.
- ``loading``: YAML and ``a.b=c`` overrides → :class:`Config`, each value parsed by its field's type; back to YAML.
- ``derived``: :func:`resolve` and the list of derived fields (a field's comment says "derived").
- ``validation``: :func:`validate`, the checks of values against each other, the registries and the machine.

Removed keys (:data:`REMOVED_KEYS`) fail to load with what replaces them. Values for what is not built yet
(several ``inference.remote_urls``) load, and :func:`validate` rejects them until they are built.

Errors: everything raises :class:`ConfigError` (a ``ValueError``) with the offending key in the message.
"""

from skyrl_train.config.derived import resolve
from skyrl_train.config.loading import apply_overrides, from_dict, load_config, record_config, to_dict, to_yaml
from skyrl_train.config.schema import (
    REMOVED_KEYS,
    AlgorithmConfig,
    Config,
    ConfigError,
    DataConfig,
    EnvironmentConfig,
    GeneratorSection,
    InferenceConfig,
    LoggerName,
    ModelConfig,
    OptimConfig,
    RayConfig,
    TrainerConfig,
    WorkerGroupRole,
    lora_target_modules,
    worker_group_size,
)
from skyrl_train.config.validation import validate

__all__ = [
    "REMOVED_KEYS",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvironmentConfig",
    "GeneratorSection",
    "InferenceConfig",
    "LoggerName",
    "ModelConfig",
    "OptimConfig",
    "RayConfig",
    "TrainerConfig",
    "WorkerGroupRole",
    "apply_overrides",
    "from_dict",
    "load_config",
    "lora_target_modules",
    "record_config",
    "resolve",
    "to_dict",
    "to_yaml",
    "validate",
    "worker_group_size",
]
