"""omni_mp: multi-process serving of multi-stage omni models on vLLM 0.25.0."""

__version__ = "0.1.0"
