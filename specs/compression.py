"""`Compression`: variants of a trained model — each an ordered list of pruning, quantization and
distillation stages — for a hardware target, each bounded by a maximum accuracy drop."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from specs.base import Name, SpecModel

HardwareTarget = Literal["x86-avx2", "x86-avx512-vnni", "arm64", "jetson-orin", "nvidia-gpu"]
#: Limits (docs/security.md): each variant is one workflow step.
MAX_VARIANTS = 32
MAX_STAGES = 16


class Prune(SpecModel):
    """Structured pruning: whole neurons/channels with the smallest L1 norm are removed (the model
    gets physically smaller), then a short fine-tune recovers accuracy."""

    type: Literal["prune"] = Field(description="Stage type.")
    method: Literal["l1-structured"] = Field(default="l1-structured", description="Pruning criterion.")
    sparsity: float = Field(gt=0, lt=1, description="Fraction of neurons/channels removed per prunable layer.")
    fine_tune_epochs: int = Field(default=2, ge=0, le=1000, description="Epochs of fine-tuning after pruning.")


class Quantize(SpecModel):
    """INT8 quantization with Intel Neural Compressor: post-training (`ptq`, calibrated) or
    quantization-aware training (`qat`)."""

    type: Literal["quantize"] = Field(description="Stage type.")
    mode: Literal["ptq", "qat"] = Field(default="ptq", description="Post-training or quantization-aware.")
    dtype: Literal["int8"] = Field(default="int8", description="Target integer type.")
    calibration_samples: int = Field(default=256, ge=1, le=1_000_000, description="Samples used to calibrate (ptq).")
    qat_epochs: int = Field(default=1, ge=1, le=1000, description="Epochs of quantization-aware training (qat).")


class Distill(SpecModel):
    """Knowledge distillation: the current model (the student) learns from a teacher's soft labels."""

    type: Literal["distill"] = Field(description="Stage type.")
    teacher_ref: Name | None = Field(
        default=None, description="Name of the Model whose trained weights teach. Required."
    )
    temperature: float = Field(default=4.0, gt=0, le=100, description="Softmax temperature of the soft labels.")
    alpha: float = Field(default=0.7, ge=0, le=1, description="Weight of the distillation loss vs the label loss.")
    epochs: int = Field(default=3, ge=1, le=1000, description="Epochs of distillation.")

    @model_validator(mode="after")
    def _needs_teacher(self) -> "Distill":
        if self.teacher_ref is None:
            raise ValueError("a distill stage needs a teacher: set `teacherRef` to a Model name")
        return self


Stage = Annotated[Union[Prune, Quantize, Distill], Field(discriminator="type")]


class Variant(SpecModel):
    """One compressed variant: its stages run in order on the evaluated model."""

    name: Name = Field(description="Variant name; an Endpoint serves `variant: <name>` (or `base`).")
    stages: list[Stage] = Field(
        min_length=1, max_length=MAX_STAGES, description=f"Stages, applied in order (at most {MAX_STAGES})."
    )
    max_accuracy_drop: float | None = Field(
        default=None, ge=0, le=100, description="Overrides the Compression's `maxAccuracyDrop` for this variant."
    )

    @model_validator(mode="after")
    def _order(self) -> "Variant":
        kinds = [s.type for s in self.stages]
        if "quantize" in kinds and kinds.index("quantize") != len(kinds) - 1:
            raise ValueError("quantize must be the last stage: nothing can train an INT8 model further")
        if kinds.count("quantize") > 1:
            raise ValueError("a variant quantizes at most once")
        return self


class CompressionSpec(SpecModel):
    """Compressed variants of a Model for a hardware target; a variant whose accuracy drops more
    than the bound is rejected and never registered."""

    hardware_target: HardwareTarget = Field(description="Hardware the variants are built and measured for.")
    max_accuracy_drop: float = Field(
        default=1.0, ge=0, le=100, description="Most accuracy (percentage points) a variant may lose."
    )
    variants: list[Variant] = Field(
        min_length=1, max_length=MAX_VARIANTS,
        description=f"Variants to build, one workflow task each (at most {MAX_VARIANTS}).",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> "CompressionSpec":
        names = [v.name for v in self.variants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(dupes)}")
        if "base" in names:
            raise ValueError("`base` names the uncompressed model; choose another variant name")
        return self
