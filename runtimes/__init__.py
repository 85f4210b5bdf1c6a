"""The code the rendered workflow steps and model servers run.

One entry point, ``python -m runtimes <step> --config FILE | --config-json TEXT``, with the steps
``prepare`` (``prepare-group`` and ``join-shards`` for a sharded data set), ``train``, ``pick-best``, ``evaluate``, ``explain`` (Captum), ``compress``, ``export`` (ONNX + ONNX Runtime INT8),
``build-engine`` (TensorRT), ``benchmark``, ``register``, ``serve`` (MLServer,
Open Inference v2) and ``serve-seldon`` (the seldon-core 1.17.1 wrapper, in its own environment).
Each step reads one config of ``specs.stepconfig`` and writes its artifacts under
``$FORGE_WORKSPACE``; see ``docs/runtimes.md``.

Layering: ``runtimes`` imports ``specs`` and nothing else of Forge. Heavy libraries (torch,
DeepSpeed, Neural Compressor, MLServer, seldon-core) are imported inside the step that needs them,
so the dispatcher starts in either environment.

Failures a user can cause raise :class:`runtimes.errors.StepFailed` (or a subclass carrying its
own exit code); the dispatcher prints its one-line message and exits non-zero, never a traceback.
"""

STEPS = ("prepare", "prepare-group", "join-shards", "train", "pick-best", "evaluate", "explain", "compress", "export", "build-engine", "benchmark", "register",
         "serve", "serve-seldon", "await", "autolabel", "merge-labels", "labels-export")

__all__ = ["STEPS"]
