"""The client plane: embed omni_mp in a service. `OmniClient` (sync) and `AsyncOmniClient`
(asyncio) talk to a running coordinator over ZMQ; importing them imports neither torch nor vLLM.

Modules: `omni_client` (the clients, their errors), `args` (request arguments checked before
sending), `link` (the connection watch and CURVE handshake errors), `media` (audio and image
inputs from files or arrays, by the media rules).
"""

from omni_mp.client.link import DEFAULT_CONNECT_TIMEOUT_S, HandshakeError
from omni_mp.client.omni_client import AsyncOmniClient, InvalidRequest, OmniClient, RequestError
from omni_mp.wire.outputs import ImageChunk, final_image

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "AsyncOmniClient",
    "HandshakeError",
    "ImageChunk",
    "InvalidRequest",
    "OmniClient",
    "RequestError",
    "final_image",
]
