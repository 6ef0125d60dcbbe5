"""What every wire module shares, torch or not: the wire's dtype table, a tensor's header,
and the one error type. Apart from tensor_codec so that its torch counterpart
(torch_tensors) and it need not import each other."""

from __future__ import annotations

# Name on the wire -> bytes per element. Names are torch's own (str(dtype) minus "torch.").
WIRE_DTYPES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
    "bool": 1,
}
Header = tuple[str, list[int], int]  # (dtype name, shape, nbytes)


class PayloadError(ValueError):
    """A message failed validation. The message text names the field path, the value and the
    limit; `request_id` is set when the offending message's request id could be recovered,
    so a stage can answer with an error event for exactly that request."""

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id
