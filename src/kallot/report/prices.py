"""The price table of ``kallot report waste --prices FILE``: price per GPU-hour per GPU model.

YAML or JSON, model names as kallot spells them or as NVML does (``canonical_model``)::

    currency: USD
    perGpuHour:
      H100-80GB: 4.00
      NVIDIA A100-SXM4-80GB: 2.50
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kallot.config.errors import config_error
from kallot.config.files import read_text
from kallot.core.errors import ConfigError
from kallot.core.resources import canonical_model


class PriceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    currency: str = Field(default="USD", min_length=1, max_length=8)
    per_gpu_hour: dict[str, float] = Field(alias="perGpuHour")

    def table(self) -> dict[str, float]:
        """Model (kallot's name) -> price per GPU-hour."""
        return {canonical_model(k): v for k, v in self.per_gpu_hour.items()}


def load_prices(path: Path) -> PriceFile:
    """Read and validate a price file; ConfigError naming the file, the field and the value."""
    where = str(path)
    text = read_text(path, "--prices", "a readable price file")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(where, text[:40], f"valid YAML/JSON ({exc})") from None
    try:
        prices = PriceFile.model_validate(data)
    except ValidationError as exc:
        err = config_error(exc)
        raise ConfigError(f"{where}: {err.field}", err.value, err.expected) from None
    for model, price in prices.per_gpu_hour.items():
        if not price >= 0:
            raise ConfigError(f"{where}: perGpuHour.{model}", price, "a price >= 0")
    return prices
