from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from skyrl_train.config import (
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    TrainerConfig,
    apply_overrides,
    from_dict,
    load_config,
    record_config,
    resolve,
    to_dict,
    to_yaml,
    validate,
    worker_group_size,
)
from skyrl_train.config import validation as validation_module


@pytest.fixture
def valid(tmp_path: Path) -> Config:
    """A config that passes validate(): a local model dir, a data file, small batches."""
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    return load_config(
        None,
        [
            f"model.path={model}",
            f"data.train_data={data}",
            "trainer.train_batch_size=8",
            "trainer.policy_mini_batch_size=4",
            "trainer.micro_train_batch_size=2",
            "generator.n_samples_per_prompt=2",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )


def _errors(config: Config) -> str:
    with pytest.raises(ConfigError) as info:
        validate(config)
    return str(info.value)


def _replace(config: Config, section: str, **changes: object) -> Config:
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **changes)})


# --------------------------------------------------------------------------------------------- loading


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "trainer:\n  train_batch_size: 64\n  epochs: 3\noptim:\n  lr: 1e-5\ngenerator:\n  temperature: 0.7\n"
    )
    config = load_config(path, ["trainer.epochs=5", "generator.top_k=20"])
    assert config.trainer.train_batch_size == 64
    assert config.trainer.epochs == 5  # the override wins over the file
    assert config.optim.lr == pytest.approx(1e-5)  # YAML 1.1 reads 1e-5 as a string; the float field parses it
    assert config.generator.temperature == pytest.approx(0.7)
    assert config.generator.top_k == 20
    assert config.data == DataConfig()  # untouched sections keep their defaults


@pytest.mark.parametrize(
    ("override", "section", "name", "expected"),
    [
        ("trainer.seed=7", "trainer", "seed", 7),
        ("optim.lr=3e-6", "optim", "lr", 3e-6),
        ("optim.weight_decay=0", "optim", "weight_decay", 0.0),
        ("data.shuffle=false", "data", "shuffle", False),
        ("trainer.eval_before_train=True", "trainer", "eval_before_train", True),
        ("trainer.max_training_steps=12", "trainer", "max_training_steps", 12),
        ("trainer.max_training_steps=null", "trainer", "max_training_steps", None),
        ("model.ref_path=none", "model", "ref_path", None),
        ("model.path=some/dir", "model", "path", "some/dir"),
        ("trainer.resume_mode=from_path", "trainer", "resume_mode", "from_path"),
        ("data.train_data=a.parquet,b.jsonl", "data", "train_data", ["a.parquet", "b.jsonl"]),
        ("data.val_data=", "data", "val_data", []),
        ("trainer.logger=[console, tensorboard]", "trainer", "logger", ["console", "tensorboard"]),
        ("optim.adam_betas=[0.9,0.95]", "optim", "adam_betas", [0.9, 0.95]),
        ("generator.stop=['</answer>']", "generator", "stop", ["</answer>"]),
        (
            "generator.chat_template_kwargs={enable_thinking: false}",
            "generator",
            "chat_template_kwargs",
            {"enable_thinking": False},
        ),
        ("off_policy.tis_ratio_type=token", "off_policy", "tis_ratio_type", "token"),
        ("off_policy.outlier_token_is_threshold_low=1e-4", "off_policy", "outlier_token_is_threshold_low", 1e-4),
    ],
)
def test_override_type_coercion(override: str, section: str, name: str, expected: object) -> None:
    value = getattr(getattr(load_config(None, [override]), section), name)
    assert value == expected
    assert type(value) is type(expected)


def test_override_into_mapping_field() -> None:
    config = load_config(
        None, ["environment.env_configs.text2sql.db_path=/data/db", "environment.env_configs.text2sql.max_rows=50"]
    )
    assert config.environment.env_configs == {"text2sql": {"db_path": "/data/db", "max_rows": 50}}
    deep = load_config(None, ["environment.env_configs.search.retriever.topk=3"])
    assert deep.environment.env_configs == {"search": {"retriever": {"topk": 3}}}
    assert type(deep.environment.env_configs["search"]["retriever"]["topk"]) is int
    assert "topk: 3" in to_yaml(deep)  # no command-line string type leaks into the dump


def test_unknown_key_suggests_the_closest() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key trainer\.trian_batch_size; did you mean trainer\.train_batch_size\?"
    ):
        load_config(None, ["trainer.trian_batch_size=8"])
    with pytest.raises(ConfigError, match=r"unknown key trainr; did you mean trainer\?"):
        load_config(None, ["trainr.seed=1"])


def test_unknown_key_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("generator:\n  n_sample_per_prompt: 4\n")
    with pytest.raises(
        ConfigError, match=r"generator\.n_sample_per_prompt; did you mean generator\.n_samples_per_prompt"
    ):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.train_batch_size=abc", r"trainer\.train_batch_size: expected int, got 'abc'"),
        ("trainer.train_batch_size=1.5", r"trainer\.train_batch_size: expected int"),
        ("data.shuffle=maybe", r"data\.shuffle: expected bool"),
        ("trainer.seed=null", r"trainer\.seed: expected int"),
        ("trainer.resume_mode=lastest", r"trainer\.resume_mode: expected one of .*did you mean 'latest'\?"),
        ("trainer.logger=[console,tensorbord]", r"trainer\.logger\[1\]: expected one of"),
        ("optim.adam_betas=fast", r"optim\.adam_betas\[0\]: expected float"),
        ("generator.chat_template_kwargs=[1]", r"generator\.chat_template_kwargs: expected a mapping"),
    ],
)
def test_wrong_types_name_key_and_type(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_wrong_type_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  epochs: true\n")
    with pytest.raises(ConfigError, match=r"trainer\.epochs: expected int, got bool"):
        load_config(path)


@pytest.mark.parametrize("override", ["trainer.seed", "=3", "+trainer.foo=1", "seed=3", "trainer..seed=1"])
def test_malformed_overrides(override: str) -> None:
    with pytest.raises(ConfigError):
        apply_overrides({}, [override])


def test_bad_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(path)
    path.write_text("trainer: 3\n")
    with pytest.raises(ConfigError, match="trainer must be a mapping"):
        load_config(path)


def test_round_trip_dict_and_yaml(tmp_path: Path) -> None:
    config = load_config(
        None,
        [
            "trainer.logger=[console,jsonl,tensorboard]",
            "environment.env_configs.search.url=http://x",
            "off_policy.sequence_mask_metric=geometric",
            "optim.lr=2e-6",
        ],
    )
    assert from_dict(to_dict(config)) == config
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(to_yaml(config))
    assert load_config(dumped) == config
    assert from_dict(to_dict(resolve(config))) == resolve(config)


# --------------------------------------------------------------------------------------------- derived


def test_resolve_fills_derived_fields_once() -> None:
    config = load_config(None, ["model.path=~/models/m", "trainer.run_dir=runs/exp1", "data.max_prompt_length=100"])
    resolved = resolve(config)
    assert resolved.model.path == str(Path("~/models/m").expanduser())
    assert resolved.model.ref_path == resolved.model.path
    assert resolved.generator.max_input_length == 100
    assert resolved.generator.eval_max_generate_length == 1024
    assert resolved.algorithm.max_seq_len == 1024
    assert resolved.trainer.run_name == "exp1"
    assert resolved.trainer.ckpt_path == "runs/exp1/checkpoints"
    assert resolved.trainer.export_path == "runs/exp1/exports"
    assert resolve(resolved) == resolved
    multi = resolve(
        load_config(None, ["data.max_prompt_length=100", "generator.max_turns=3", "generator.max_generate_length=50"])
    )
    assert multi.generator.max_input_length == 200
    capped = resolve(load_config(None, ["generator.max_response_length=700", "generator.max_turns=4"]))
    assert capped.algorithm.max_seq_len == 700
    explicit = resolve(load_config(None, ["generator.max_input_length=300", "model.ref_path=ref"]))
    assert explicit.generator.max_input_length == 300
    assert explicit.model.ref_path == "ref"


# -------------------------------------------------------------------------------------------- validate


def test_valid_config_passes(valid: Config) -> None:
    validate(valid)


def test_batch_sizes_must_divide(valid: Config) -> None:
    bad = _replace(valid, "trainer", train_batch_size=10, policy_mini_batch_size=4)
    assert "trainer.train_batch_size (10) must be a multiple of trainer.policy_mini_batch_size (4)" in _errors(bad)
    bad = _replace(valid, "trainer", micro_train_batch_size=3)  # mini 4 prompts x 2 samples = 8 rows
    assert "must be a multiple of trainer.micro_train_batch_size (3)" in _errors(bad)
    bad = _replace(valid, "trainer", backend="fsdp", num_training_workers=3)
    assert "does not split evenly over trainer.num_training_workers (3)" in _errors(bad)
    bad = _replace(valid, "trainer", train_batch_size=0)
    assert "trainer.train_batch_size must be >= 1, got 0" in _errors(bad)


def test_unknown_algorithm_names(valid: Config) -> None:
    message = _errors(_replace(valid, "algorithm", advantage_estimator="grop", policy_loss_type="regulr"))
    assert "algorithm.advantage_estimator: unknown advantage estimator 'grop'" in message
    assert "Did you mean 'grpo'?" in message
    assert "algorithm.policy_loss_type: unknown policy loss 'regulr'" in message


def test_algorithm_consistency(valid: Config) -> None:
    message = _errors(_replace(valid, "algorithm", advantage_estimator="gae"))
    assert "algorithm.advantage_estimator 'gae' needs a value model (critic): set model.critic_path" in message
    assert f"model.critic_path={valid.model.path} to start the critic from the policy's weights" in message
    both = _replace(valid, "algorithm", use_kl_loss=True, use_kl_in_reward=True)
    assert "choose one" in _errors(both)
    one_sample = _replace(valid, "generator", n_samples_per_prompt=1)
    assert "set generator.n_samples_per_prompt >= 2" in _errors(dataclasses.replace(one_sample, trainer=valid.trainer))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "maxrl"])
def test_group_estimators_need_two_samples_per_prompt(valid: Config, estimator: str) -> None:
    """A group of one gets advantage 0 from every group-relative estimator: one sample per prompt learns nothing."""
    one_sample = _replace(
        _replace(valid, "generator", n_samples_per_prompt=1), "algorithm", advantage_estimator=estimator
    )
    message = _errors(dataclasses.replace(one_sample, trainer=valid.trainer))
    assert f"algorithm.advantage_estimator {estimator!r} compares samples of one prompt" in message
    assert "use reinforce++ for one sample per prompt" in message
    reinforce = _replace(one_sample, "algorithm", advantage_estimator="reinforce++")
    validate(dataclasses.replace(reinforce, trainer=valid.trainer))


def test_gae_with_a_critic(valid: Config, tmp_path: Path) -> None:
    ppo = _replace(valid, "algorithm", advantage_estimator="gae")
    validate(_replace(ppo, "model", critic_path=valid.model.path))
    missing = str(tmp_path / "no-critic")
    assert f"model.critic_path {missing} does not exist" in _errors(_replace(ppo, "model", critic_path=missing))
    bad_clip = _replace(_replace(ppo, "model", critic_path=valid.model.path), "algorithm", value_clip=-0.1)
    assert "algorithm.value_clip must be >= 0 or null" in _errors(bad_clip)
    validate(_replace(_replace(ppo, "model", critic_path=valid.model.path), "algorithm", value_clip=None))


def test_dynamic_sampling_settings(valid: Config) -> None:
    assert load_config(None, ["algorithm.dynamic_sampling=null"]).algorithm.dynamic_sampling is None
    assert load_config(None, ["algorithm.dynamic_sampling=filter"]).algorithm.dynamic_sampling == "filter"
    with pytest.raises(ConfigError, match=r"algorithm\.dynamic_sampling: expected"):
        load_config(None, ["algorithm.dynamic_sampling=filtr"])
    validate(_replace(valid, "algorithm", dynamic_sampling="replace"))
    exhausted = _replace(valid, "algorithm", dynamic_sampling="filter", max_sample_batches=0)
    assert "algorithm.max_sample_batches must be >= 1, got 0" in _errors(exhausted)
    ratio = _replace(valid, "algorithm", dynamic_sampling="replace", min_replace_ratio=0.0)
    assert "algorithm.min_replace_ratio must be in (0, 1], got 0.0" in _errors(ratio)
    single = _replace(
        _replace(valid, "algorithm", dynamic_sampling="filter", advantage_estimator="reinforce++"),
        "generator",
        n_samples_per_prompt=1,
    )
    assert "a group of one never varies: set generator.n_samples_per_prompt >= 2" in _errors(single)


def test_missing_model_path_explains_tiny_model(valid: Config, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "tiny")
    message = _errors(_replace(valid, "model", path=missing))
    assert f"model.path {missing} does not exist" in message
    assert f"build_tiny_model('{missing}')" in message
    assert "model.path is required" in _errors(_replace(valid, "model", path=""))
    validate(_replace(valid, "model", path="Qwen/Qwen2.5-0.5B-Instruct"))  # a hub id cannot be checked offline


def test_missing_data_files(valid: Config, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.parquet")
    assert f"data.val_data: {missing} does not exist" in _errors(_replace(valid, "data", val_data=[missing]))
    assert "data.train_data is empty" in _errors(_replace(valid, "data", train_data=[]))


def test_generator_engine_and_trainer_checks(valid: Config) -> None:
    assert "generator.batched needs generator.max_turns == 1" in _errors(
        _replace(valid, "generator", batched=True, max_turns=2)
    )
    assert "generator.top_p" in _errors(_replace(valid, "generator", top_p=0.0))
    assert "smaller than data.max_prompt_length" in _errors(_replace(valid, "generator", max_input_length=10))
    assert "inference.remote_urls" in _errors(_replace(valid, "inference", engine="remote"))
    assert "gpu_memory_utilization" in _errors(_replace(valid, "inference", gpu_memory_utilization=1.5))
    assert "needs trainer.resume_path" in _errors(_replace(valid, "trainer", resume_mode="from_path"))
    assert "named global_step_N" in _errors(_replace(valid, "trainer", resume_mode="from_path", resume_path="/x/ckpt"))
    assert "No registered env with id: gsm8kk" in _errors(_replace(valid, "environment", env_class="gsm8kk"))
    assert "set trainer.backend=fsdp" in _errors(_replace(valid, "trainer", num_training_workers=2))


def test_engine_replicas_are_actors_of_a_local_or_vllm_engine(valid: Config) -> None:
    validate(_replace(valid, "inference", num_engines=2))
    remote = _replace(valid, "inference", engine="remote", remote_urls=["http://a:8000"], num_engines=2)
    assert "engine 'remote' runs elsewhere: set inference.num_engines=1" in _errors(remote)
    assert "inference.num_engines must be" in _errors(_replace(valid, "inference", num_engines=0))


def test_tensor_parallelism_is_for_vllm_engines_holding_as_many_gpus(
    valid: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validation_module, "_module_available", lambda name: True)  # vLLM, installed or not
    vllm = _replace(valid, "inference", engine="vllm", tensor_parallel_size=2)
    validate(_replace(vllm, "inference", num_gpus_per_engine=2.0))  # in this process
    validate(_replace(vllm, "inference", num_gpus_per_engine=2.0, num_engines=2))  # engine actors
    cpu = _errors(vllm)  # num_gpus_per_engine=0
    assert "inference.tensor_parallel_size=2 needs 2 GPUs per engine, but inference.num_gpus_per_engine=0" in cpu
    assert "vLLM's CPU build runs one engine process per engine" in cpu
    assert "set inference.num_gpus_per_engine=2 on GPUs, or inference.tensor_parallel_size=1" in cpu
    fewer = _errors(_replace(vllm, "inference", num_gpus_per_engine=1.0, num_engines=2))
    assert "inference.num_gpus_per_engine=1 must equal inference.tensor_parallel_size=2" in fewer
    assert "set inference.num_gpus_per_engine=2" in fewer
    local = _errors(_replace(vllm, "inference", engine="local", num_gpus_per_engine=2.0))
    assert "inference.tensor_parallel_size=2 shards a vLLM engine over GPUs: set inference.engine=vllm" in local
    assert "inference.tensor_parallel_size must be >= 1, got 0" in _errors(
        _replace(valid, "inference", tensor_parallel_size=0)
    )
    validate(_replace(valid, "inference", num_gpus_per_engine=0.5, num_engines=2))  # tp=1: any GPU share


def test_fsdp_worker_groups_refuse_what_they_cannot_do(valid: Config) -> None:
    fsdp = _replace(valid, "trainer", backend="fsdp", num_training_workers=2)
    validate(fsdp)
    assert "set model.lora_rank=0" in _errors(_replace(fsdp, "model", lora_rank=4))
    validate(_replace(fsdp, "trainer", max_tokens_per_microbatch=64))  # ranks even out their micro-batch counts
    assert "trainer.num_training_workers must be" in _errors(_replace(fsdp, "trainer", num_training_workers=0))


def test_reference_and_critic_groups_default_to_the_policy_groups_size() -> None:
    trainer = TrainerConfig(backend="fsdp", num_training_workers=4)
    assert (trainer.ref_num_workers, trainer.critic_num_workers) == (0, 0)
    assert [worker_group_size(trainer, role) for role in ("policy", "ref", "critic")] == [4, 4, 4]
    own = dataclasses.replace(trainer, ref_num_workers=1, critic_num_workers=2)
    assert [worker_group_size(own, role) for role in ("policy", "ref", "critic")] == [4, 1, 2]
    loaded = load_config(None, ["trainer.ref_num_workers=3", "trainer.critic_num_workers=5"]).trainer
    assert (loaded.ref_num_workers, loaded.critic_num_workers) == (3, 5)


@pytest.mark.parametrize("key", ["ref_num_workers", "critic_num_workers"])
def test_group_sizes_are_not_negative_and_need_worker_groups(valid: Config, key: str) -> None:
    fsdp = _replace(valid, "trainer", backend="fsdp", num_training_workers=2)
    validate(_replace(fsdp, "trainer", **{key: 1}))
    assert f"trainer.{key} must be >= 0 (0: as many as trainer.num_training_workers), got -1" in _errors(
        _replace(fsdp, "trainer", **{key: -1})
    )
    message = _errors(_replace(valid, "trainer", **{key: 2}))  # trainer.backend=torch
    assert f"trainer.{key}=2 needs worker processes: set trainer.backend=fsdp" in message
    assert f"or trainer.{key}=0" in message
    assert message.count("\n  - ") == 1  # only that problem (no batch split message for the torch backend)


def test_the_critic_group_must_split_the_mini_batches_the_reference_need_not(valid: Config) -> None:
    # mini-batches of 4 prompts × 2 samples = 8 rows, micro-batches of 2 rows
    fsdp = _replace(valid, "trainer", backend="fsdp", num_training_workers=2)
    critic = _replace(fsdp, "model", critic_path=valid.model.path)
    validate(_replace(critic, "trainer", critic_num_workers=4, ref_num_workers=3))
    assert "does not split evenly over trainer.critic_num_workers (3)" in _errors(
        _replace(critic, "trainer", critic_num_workers=3)
    )
    uneven = _errors(_replace(critic, "trainer", critic_num_workers=8))  # 1 row each, micro-batches of 2
    assert "/ 8 workers of trainer.critic_num_workers) must be a multiple of trainer.micro_train_batch_size" in uneven
    assert "trainer.num_training_workers" not in uneven  # the policy's group of 2 splits them
    validate(_replace(fsdp, "trainer", critic_num_workers=3))  # no model.critic_path: no critic group


@pytest.mark.parametrize(
    ("section", "changes", "message"),
    [
        (
            "inference",
            {"engine": "remote", "remote_urls": ["http://a:8000", "http://b:8000"]},
            "inference.remote_urls lists 2 servers; more than one is not supported yet",
        ),
    ],
)
def test_keys_of_later_issues_are_rejected_until_they_work(
    valid: Config, section: str, changes: dict[str, object], message: str
) -> None:
    errors = _errors(_replace(valid, section, **changes))
    assert message in errors
    assert "skyrl-train on Ray" in errors
    key = message.split()[0].split("=")[0]
    default = getattr(getattr(Config(), section), key.split(".")[1])
    if not isinstance(default, list):  # the message says what to set instead
        assert f"set {key}={default}" in errors


def test_training_temperature_must_be_positive(valid: Config) -> None:
    message = _errors(_replace(valid, "generator", temperature=0.0))
    assert "generator.temperature must be > 0, got 0.0" in message
    assert "generator.eval_temperature=0" in message  # greedy decoding stays available for evaluation
    validate(_replace(valid, "generator", eval_temperature=0.0))
    assert "generator.eval_temperature must be >= 0" in _errors(_replace(valid, "generator", eval_temperature=-1.0))


@pytest.mark.parametrize(
    ("override", "replacement"),
    [
        ("trainer.eval_batch_size=64", "generator.max_concurrent_trajectories"),
        ("generator.use_conversation_multi_turn=false", "its own message"),
    ],
)
def test_removed_keys_say_what_replaces_them(override: str, replacement: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(key)} was removed") as info:
        load_config(None, [override])
    assert replacement in str(info.value)


def test_lora_target_modules_must_name_modules(valid: Config) -> None:
    assert "model.lora_target_modules names no module" in _errors(
        _replace(valid, "model", lora_rank=4, lora_target_modules=" , ")
    )
    validate(_replace(valid, "model", lora_rank=4, lora_target_modules="q_proj,v_proj"))


def test_optional_packages_checked_up_front(valid: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation_module, "_module_available", lambda name: False)
    message = _errors(_replace(valid, "trainer", logger=["console", "tensorboard", "wandb"]))
    assert "trainer.logger 'tensorboard' needs the tensorboard package: pip install tensorboard" in message
    assert "trainer.logger 'wandb' needs the wandb package" in message
    assert "inference.engine 'vllm' needs vLLM" in _errors(_replace(valid, "inference", engine="vllm"))
    monkeypatch.setattr(validation_module, "_module_available", lambda name: True)
    validate(_replace(valid, "trainer", logger=["tensorboard"]))


def test_all_problems_reported_together(valid: Config) -> None:
    bad = dataclasses.replace(
        valid,
        model=ModelConfig(path=""),
        trainer=dataclasses.replace(valid.trainer, train_batch_size=10),
    )
    message = _errors(bad)
    assert message.count("\n  - ") == 2


# ------------------------------------------------------------------------------------------ print/save


def test_record_config_prints_and_saves(valid: Config, tmp_path: Path) -> None:
    printed: list[str] = []
    resolved = resolve(valid)
    path = record_config(resolved, tmp_path / "run", echo=printed.append)
    assert path == tmp_path / "run" / "config.yaml"
    assert printed == [path.read_text()]
    assert "train_batch_size: 8" in printed[0]
    assert load_config(path) == resolved
    assert not list((tmp_path / "run").glob(".*tmp"))


def test_defaults_are_documented_values() -> None:
    trainer = TrainerConfig()
    assert (trainer.train_batch_size, trainer.policy_mini_batch_size, trainer.resume_mode) == (1024, 256, "latest")
    assert (trainer.num_training_workers, trainer.ref_num_workers, trainer.critic_num_workers) == (1, 0, 0)
    assert Config().algorithm.advantage_estimator == "grpo"
    assert Config().algorithm.policy_loss_type == "regular"
