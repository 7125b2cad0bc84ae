"""The fake engine's model-parallel teardown (recorded)."""

from vllm import record


def destroy_model_parallel() -> None:
    record("destroy")
