"""The bodies of the server's own routes: /v1/models, LoRA adapters loaded and unloaded, /version, /health."""

import time
from typing import Literal

from pydantic import BaseModel, Field

from frontend.endpoints.openai_schemas.body_types import StrictModel


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "nvllm"
    max_model_len: int
    root: str | None = Field(None, description="a LoRA adapter's folder; the base model's name for the base model")
    parent: str | None = Field(None, description="a LoRA adapter's base model (null for the base model)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(StrictModel):
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)
    load_inplace: bool = Field(False, description="replace an adapter already loaded under this name (vLLM's)")


class UnloadLoRAAdapterRequest(StrictModel):
    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None  # vLLM's field; the name is what identifies the adapter here


class VersionResponse(BaseModel):
    version: str


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
