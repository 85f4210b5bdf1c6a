"""The DeepSpeed config a `strategy: deepspeed` Model trains with, rendered from its spec."""

from __future__ import annotations

from typing import Any

from specs import Model


def deepspeed_config(model: Model, world_size: int) -> dict[str, Any]:
    """DeepSpeed's JSON config: batch sizes, ZeRO stage and offload, bf16/fp16 (with dynamic loss
    scaling), the optimizer, and a flag the runtime reads for activation checkpointing."""
    spec = model.spec
    hp = spec.hyperparameters
    dist = spec.distributed
    dp = max(world_size // (dist.tensor_parallel * dist.pipeline_parallel), 1)
    optimizer_type = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[hp.optimizer]
    params: dict[str, Any] = {"lr": hp.learning_rate, "weight_decay": hp.weight_decay}
    if hp.optimizer == "sgd":
        params["momentum"] = hp.momentum
    zero: dict[str, Any] = {"stage": dist.zero_stage}
    if dist.zero_stage >= 2:
        zero.update({"overlap_comm": True, "contiguous_gradients": True})
    if dist.offload in ("optimizer", "optimizer+parameters"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if dist.offload == "optimizer+parameters":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if dist.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": hp.batch_size,
        "gradient_accumulation_steps": hp.gradient_accumulation_steps,
        "train_batch_size": hp.batch_size * hp.gradient_accumulation_steps * dp,
        "optimizer": {"type": optimizer_type, "params": params},
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        "steps_per_print": 50,
        "seed": hp.seed,
        "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False},
        "forge": {"gradient_checkpointing": spec.gradient_checkpointing},
    }
    if hp.warmup_steps:
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": hp.learning_rate, "warmup_num_steps": hp.warmup_steps},
        }
    if spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif spec.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    return config
