"""`Compression`: variants of a trained model — each an ordered list of pruning, quantization and
distillation stages — for a hardware target, each bounded by a maximum accuracy drop."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from specs.base import LaterFieldsModel, Name, SpecModel

HardwareTarget = Literal["x86-avx2", "x86-avx512-vnni", "arm64", "jetson-orin", "nvidia-gpu"]
#: Targets whose exported variants are quantized by ONNX Runtime (static INT8 on the CPU) …
CPU_TARGETS = ("x86-avx2", "x86-avx512-vnni", "arm64")
#: … and those that get a TensorRT engine built from the ONNX graph (on the device).
TENSORRT_TARGETS = ("jetson-orin", "nvidia-gpu")
#: Bundle kinds of the export step, which name the variants it registers: `<variant>-onnx` (the
#: verified fp32 graph) and `<variant>-onnx-int8` (ONNX Runtime's static INT8 of it).
EXPORT_KINDS = ("onnx", "onnx-int8")
#: Limits (docs/security.md): each variant is one workflow step.
MAX_VARIANTS = 32
MAX_STAGES = 16


def export_variant(source: str, kind: str) -> str:
    """The registered name of ``source``'s export of ``kind`` (one of :data:`EXPORT_KINDS`)."""
    return f"{source}-{kind}"


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
    def _needs_teacher(self) -> Distill:
        if self.teacher_ref is None:
            raise ValueError("a distill stage needs a teacher: set `teacherRef` to a Model name")
        return self


Stage = Annotated[Prune | Quantize | Distill, Field(discriminator="type")]


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
    def _order(self) -> Variant:
        kinds = [s.type for s in self.stages]
        if "quantize" in kinds and kinds.index("quantize") != len(kinds) - 1:
            raise ValueError("quantize must be the last stage: nothing can train an INT8 model further")
        if kinds.count("quantize") > 1:
            raise ValueError("a variant quantizes at most once")
        return self


class OnnxInt8(SpecModel):
    """Static INT8 with ONNX Runtime (QDQ, per-channel weights), calibrated on training rows: for
    CPU and ARM targets (`x86-avx2`, `x86-avx512-vnni`, `arm64`)."""

    enabled: bool = Field(default=True, description="Build the `<variant>-onnx-int8` variant (CPU/ARM targets only).")
    calibration_samples: int = Field(default=256, ge=1, le=100_000, description="Training rows the activation ranges are calibrated on.")
    max_accuracy_drop: float | None = Field(
        default=None, ge=0, le=100, description="Most accuracy (points) it may lose against its PyTorch source; default the Compression's."
    )


class TensorRT(SpecModel):
    """A TensorRT engine built from the verified ONNX graph, for `jetson-orin` and `nvidia-gpu`
    targets. It needs TensorRT (`trtexec`) on the target device: the step is rendered for the
    cluster's GPU/Jetson nodes, and a machine without TensorRT records it as not built."""

    precision: Literal["fp32", "fp16"] = Field(default="fp16", description="Engine precision.")
    workspace_mib: int = Field(default=1024, ge=64, le=65_536, description="Builder workspace (MiB).")
    max_batch_size: int = Field(default=64, ge=1, le=4096, description="Largest batch of the optimization profile.")


class Export(SpecModel):
    """Export variants to ONNX (`torch.onnx`), verified against the PyTorch model on the held-out
    split, then built for the hardware target: ONNX Runtime static INT8 for CPU/ARM targets, a
    TensorRT engine for Jetson/NVIDIA GPU targets."""

    format: Literal["onnx"] = Field(default="onnx", description="Export format.")
    variants: list[Name] = Field(
        default_factory=lambda: ["base"], min_length=1, max_length=MAX_VARIANTS,
        description="Float variants to export (`base` or a variant without a quantize stage): each becomes `<variant>-onnx`.",
    )
    opset: int = Field(default=18, ge=13, le=23, description="ONNX opset.")
    max_abs_diff: float = Field(
        default=1e-4, gt=0, le=1, description="Largest difference of any class probability between PyTorch and ONNX Runtime on the held-out split."
    )
    int8: OnnxInt8 = Field(default_factory=OnnxInt8, description="ONNX Runtime static INT8 (CPU/ARM targets).")
    tensorrt: TensorRT = Field(default_factory=TensorRT, description="TensorRT engine (Jetson/NVIDIA GPU targets).")

    @model_validator(mode="after")
    def _unique(self) -> Export:
        if len(set(self.variants)) != len(self.variants):
            raise ValueError("export.variants names a variant twice")
        return self


class Benchmark(SpecModel):
    """How the `benchmark` step measures every variant (latency, throughput, memory, accuracy),
    all on the same node and in alternating rounds, so the leaderboard compares like with like."""

    batch_sizes: list[int] = Field(
        default_factory=lambda: [1, 8, 64], min_length=1, max_length=8, description="Batch sizes measured (rows per call)."
    )
    seconds: float = Field(default=0.3, gt=0, le=60, description="Measuring time per variant and batch size.")
    threads: int = Field(default=1, ge=1, le=256, description="CPU threads each runtime may use (PyTorch and ONNX Runtime alike).")

    @model_validator(mode="after")
    def _sizes(self) -> Benchmark:
        if any(b < 1 or b > 65_536 for b in self.batch_sizes):
            raise ValueError("batchSizes must be between 1 and 65536")
        return self


class CompressionSpec(LaterFieldsModel):
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
    export: Export | None = Field(
        default=None, description="Export variants to ONNX and build them for the hardware target (see `Export`)."
    )
    benchmark: Benchmark | None = Field(
        default=None, description="Settings of the `benchmark` step (which always runs; these are its defaults when unset)."
    )

    added_later = {"export": None, "benchmark": None}

    def exported_variants(self) -> dict[str, tuple[str, str]]:
        """The ONNX variants the export step registers, by name → (source variant, bundle kind):
        `<v>-onnx` for each exported variant, and `<v>-onnx-int8` beside it on a CPU/ARM target
        with `int8` enabled (a TensorRT target's engine is an artifact, not a servable variant)."""
        if self.export is None:
            return {}
        kinds = EXPORT_KINDS if self.hardware_target in CPU_TARGETS and self.export.int8.enabled else EXPORT_KINDS[:1]
        return {export_variant(source, kind): (source, kind) for source in self.export.variants for kind in kinds}

    def servable_variants(self) -> list[str]:
        """Every variant a version of a Model with this Compression registers and an Endpoint may
        serve: `base`, the Compression's variants, then their ONNX exports."""
        return ["base", *(v.name for v in self.variants), *self.exported_variants()]

    @model_validator(mode="after")
    def _unique_names(self) -> CompressionSpec:
        names = [v.name for v in self.variants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(dupes)}")
        if "base" in names:
            raise ValueError("`base` names the uncompressed model; choose another variant name")
        if self.export is not None:
            float_variants = {"base"} | {v.name for v in self.variants if not any(s.type == "quantize" for s in v.stages)}
            for name in self.export.variants:
                if name not in float_variants:
                    what = "is quantized by PyTorch" if name in names else "is not a variant of this Compression"
                    raise ValueError(f"export.variants: {name!r} {what}; export `base` or a float variant "
                                     f"({', '.join(sorted(float_variants))}) and let the target's runtime quantize it")
            taken = {export_variant(n, kind) for n in self.export.variants for kind in EXPORT_KINDS}
            clash = sorted(taken & set(names))
            if clash:
                raise ValueError(f"variant names {', '.join(clash)} are taken by the ONNX exports; rename them")
        return self
