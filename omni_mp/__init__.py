"""omni_mp: multi-process serving of multi-stage omni models on vLLM 0.25.0.

The public names load on first use, so `import omni_mp` stays cheap (and torch-free):

    from omni_mp import OmniClient, load_config
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _client() -> Any:
    from omni_mp.client import omni_client

    return omni_client


def _link() -> Any:
    from omni_mp.client import link

    return link


def _outputs() -> Any:
    from omni_mp.wire import outputs

    return outputs


def _validate() -> Any:
    from omni_mp.config import validate

    return validate


def _schema() -> Any:
    from omni_mp.config import schema

    return schema


def _configs() -> Any:
    from omni_mp import stage_configs

    return stage_configs


def _keys() -> Any:
    from omni_mp.wire import keys

    return keys


# public name -> the module that defines it (imported on first use)
_EXPORTS: dict[str, Callable[[], Any]] = {
    "OmniClient": _client,
    "AsyncOmniClient": _client,
    "RequestError": _client,
    "InvalidRequest": _client,
    "HandshakeError": _link,
    "ImageChunk": _outputs,
    "load_config": _validate,
    "ConfigError": _schema,
    "PipelineConfig": _schema,
    "shipped_config": _configs,
    "client_identity": _keys,
}
__all__ = [
    "AsyncOmniClient",
    "ConfigError",
    "HandshakeError",
    "ImageChunk",
    "InvalidRequest",
    "OmniClient",
    "PipelineConfig",
    "RequestError",
    "client_identity",
    "load_config",
    "shipped_config",
]

if TYPE_CHECKING:
    from omni_mp.client.link import HandshakeError
    from omni_mp.client.omni_client import AsyncOmniClient, InvalidRequest, OmniClient, RequestError
    from omni_mp.config.schema import ConfigError, PipelineConfig
    from omni_mp.config.validate import load_config
    from omni_mp.stage_configs import shipped_config
    from omni_mp.wire.keys import client_identity
    from omni_mp.wire.outputs import ImageChunk


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'omni_mp' has no attribute {name!r}")
    value = getattr(module(), name)
    globals()[name] = value
    return value
