"""Language models: a decoder with a key/value cache run by Kiln's VM (or onnxruntime, the
reference), and generation on top of it (greedy or sampled, streaming, left-padded batches).

>>> from kiln.llm import generate, kiln_decoder
>>> from kiln.models import smollm2, smollm2_tokenizer
>>> tok = smollm2_tokenizer()
>>> dec = kiln_decoder(smollm2())
>>> prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi!"}]))
>>> out = generate(dec, [prompt], max_new_tokens=32, stop_token_ids=[tok.eos_token_id])
>>> tok.decode(out.tokens[0])

May import: kiln.driver, kiln.frontend, kiln.models, kiln.runtime, kiln.vm, kiln.progress (and
kiln.errors).
"""

from kiln.llm.decoder import Decoder, compiled_decoder_path, kiln_decoder, ort_decoder
from kiln.llm.generate import Generation, TextStreamer, generate, left_pad
from kiln.llm.sampling import (
    SamplingConfig,
    apply_repetition_penalty,
    next_tokens,
    token_probs,
)

__all__ = [
    "Decoder",
    "Generation",
    "SamplingConfig",
    "TextStreamer",
    "apply_repetition_penalty",
    "compiled_decoder_path",
    "generate",
    "kiln_decoder",
    "left_pad",
    "next_tokens",
    "ort_decoder",
    "token_probs",
]
