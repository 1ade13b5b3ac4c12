"""The Tinker API's bodies as rlvr's values and back: protobuf for ``forward_backward`` and the sample and
forward-backward results (the SDK's own schema, ``tinker.proto``), JSON (the SDK's ``tinker.types``) for the rest.

Every body is untrusted: a malformed one is a ``WireError`` naming the field, never an exception from deep inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlvr.tinker.models import Datum
from rlvr.tinker.sampling import Request, Sampled

MAX_BODY_BYTES = 1 << 30  # a forward_backward body, decompressed


class WireError(ValueError):
    """A request body that does not parse, or asks for what the server does not do."""


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


@dataclass
class TrainRequest:
    """A ``forward_backward`` (or, with ``forward_only``, a ``forward``) request."""

    model_id: str
    datums: list[Datum]
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool


def decompress(body: bytes, encoding: str | None) -> bytes:
    if not encoding or encoding == "identity":
        return body
    if encoding != "zstd":
        raise WireError(f"Content-Encoding {encoding!r} is not supported (zstd is)")
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_BODY_BYTES)
    except zstandard.ZstdError as err:
        raise WireError(f"the zstd body does not decompress: {err}") from None


def _tensor(msg: Any, where: str) -> torch.Tensor:
    """A proto ``Tensor`` (dense, or sparse CSR) as a dense torch tensor."""
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if msg.dtype not in dtypes:
        raise WireError(f"{where}: tensor dtype {msg.dtype} is not supported (float32, int64, int32 are)")
    dtype = dtypes[msg.dtype]
    shape = [int(s) for s in msg.shape]
    try:
        if msg.HasField("sparse_csr"):
            csr = msg.sparse_csr
            values = torch.from_numpy(np.frombuffer(csr.values, dtype=dtype).copy())
            crow = torch.from_numpy(np.frombuffer(csr.crow_indices, dtype=np.int64).copy())
            col = torch.from_numpy(np.frombuffer(csr.col_indices, dtype=np.int64).copy())
            return torch.sparse_csr_tensor(crow, col, values, size=shape).to_dense()
        values = torch.from_numpy(np.frombuffer(msg.dense, dtype=dtype).copy())
        return values.reshape(shape) if shape else values
    except (ValueError, RuntimeError) as err:
        raise WireError(f"{where}: the tensor's bytes do not match its dtype and shape ({err})") from None


def _tokens(chunks: Sequence[Any], where: str) -> torch.Tensor:
    parts = []
    for chunk in chunks:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"{where}: {kind} chunks are not supported (text models only: encoded_text)")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    return torch.from_numpy(np.concatenate(parts).astype(np.int64)) if parts else torch.zeros(0, dtype=torch.long)


def train_request(body: bytes) -> TrainRequest:
    """A ``ForwardBackwardRequest`` proto body."""
    from google.protobuf.message import DecodeError

    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as err:
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest: {err}") from None
    datums = []
    for i, d in enumerate(msg.data):
        inputs = {name: _tensor(t, f"datum {i} loss_fn_inputs[{name!r}]") for name, t in d.loss_fn_inputs.items()}
        datums.append(Datum(_tokens(d.model_input, f"datum {i}"), inputs))
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # the newer map wins where both are set
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    return TrainRequest(msg.model_id, datums, msg.loss_fn, config, bool(msg.forward_only))


def train_result(log_probs: Sequence[torch.Tensor], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput`` proto: each datum's log-probs of its targets, and the metrics."""
    pb = _pb()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    record = out.loss_fn_outputs.add()
    record.num_datums = len(log_probs)
    arrays = [lp.detach().to("cpu", torch.float32).numpy() for lp in log_probs]
    field = record.fields["logprobs"]
    field.dtype = pb.DTYPE_FLOAT32
    field.data = b"".join(a.tobytes() for a in arrays)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.nbytes for a in arrays], out=offsets[1:])
    field.offsets = offsets.tobytes()
    return out.SerializeToString()


def field(body: dict, key: str, kind: type | tuple[type, ...], default: Any = ..., where: str = "body") -> Any:
    """``body[key]`` checked to be a ``kind``; WireError naming it when it is missing (and has no default) or not."""
    if key not in body or body[key] is None:
        if default is ...:
            raise WireError(f"{where}: {key} is required")
        return default
    value = body[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        names = " or ".join(k.__name__ for k in _kinds(kind))
        raise WireError(f"{where}: {key} must be {names}, got {type(value).__name__}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def prompt_tokens(model_input: Any, where: str = "prompt") -> torch.Tensor:
    """A ``ModelInput``'s tokens, ``{"chunks": [{"type": "encoded_text", "tokens": [...]}, ...]}`` (text only)."""
    if not isinstance(model_input, dict):
        raise WireError(f"{where} must be a ModelInput object")
    parts: list[int] = []
    for chunk in field(model_input, "chunks", list, where=where):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise WireError(f"{where}: {kind} chunks are not supported (text models only: encoded_text)")
        tokens = field(chunk, "tokens", list, where=where)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise WireError(f"{where}: tokens must be integers")
        parts.extend(tokens)
    return torch.tensor(parts, dtype=torch.long)


UNSUPPORTED_SAMPLE_OPTIONS = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k",
                              "target_prompt_logprobs", "prompt_logprobs_last_n")


def sample_request(body: dict) -> Request:
    """An ``asample`` body (the SDK's ``SampleRequest``) as a sampling ``Request``."""
    for option in UNSUPPORTED_SAMPLE_OPTIONS:
        if body.get(option):
            raise WireError(f"{option} is not supported by rlvr's Tinker server (log-probs of the sampled tokens "
                            "and of the prompt's own tokens are)")
    params = field(body, "sampling_params", dict)
    where = "sampling_params"
    stop = params.get("stop") or []
    stop = [stop] if isinstance(stop, (str, int)) else stop
    if not isinstance(stop, list) or not all(isinstance(s, (str, int)) for s in stop):
        raise WireError("sampling_params: stop must be a string, a token id, or a list of either")
    number = (int, float)
    return Request(prompt=prompt_tokens(field(body, "prompt", dict)),
                   num_samples=field(body, "num_samples", int, 1),
                   max_tokens=field(params, "max_tokens", int, None, where),
                   temperature=float(field(params, "temperature", number, 1.0, where)),
                   top_k=field(params, "top_k", int, -1, where),
                   top_p=float(field(params, "top_p", number, 1.0, where)),
                   seed=field(params, "seed", int, None, where),
                   stop_strings=tuple(s for s in stop if isinstance(s, str)),
                   stop_tokens=tuple(s for s in stop if not isinstance(s, str)),
                   prompt_logprobs=bool(body.get("prompt_logprobs")))


def sample_result(sampled: Sampled) -> bytes:
    """A ``SampleResponse`` proto."""
    pb = _pb()
    out = pb.SampleResponse()
    for seq in sampled.sequences:
        s = out.sequences.add()
        s.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        s.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        s.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if sampled.prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in sampled.prompt_logprobs]
        out.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return out.SerializeToString()
