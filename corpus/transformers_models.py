"""Hugging Face transformers builders: tiny configs (2 layers, hidden 64), random weights.

Every builder returns a module whose ``forward`` takes the corpus inputs positionally and
returns tensors (``last_hidden_state``, ``logits``, present keys/values), so both exporters see
the same signature. Nothing is downloaded: configs are built in code.
"""

from __future__ import annotations

#: the tiny sizes every text config shares
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            vocab_size=1000, max_position_embeddings=128)


def _config(config_cls: str, overrides: dict):
    """``config_cls`` built from TINY updated by ``overrides``; an override of None drops a
    TINY key the config refuses (Funnel sets its depth by ``block_sizes`` only)."""
    import transformers

    kwargs = {k: v for k, v in {**TINY, **overrides}.items() if v is not None}
    return getattr(transformers, config_cls)(**kwargs)


def _eval(cls, config):
    import torch

    torch.manual_seed(0)
    return cls(config).eval()


def encoder(model_cls: str, config_cls: str, with_mask: bool = True, **overrides):
    """An encoder (``input_ids``, ``attention_mask`` → ``last_hidden_state``)."""
    import torch
    import transformers

    cfg = _config(config_cls, overrides)
    inner = _eval(getattr(transformers, model_cls), cfg)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids,
                              attention_mask=attention_mask if with_mask else None
                              ).last_hidden_state

    return Encoder().eval()


def causal_lm(model_cls: str, config_cls: str, **overrides):
    """A decoder without cache (``input_ids``, ``attention_mask`` → ``logits``)."""
    import torch
    import transformers

    cfg = _config(config_cls, overrides)
    inner = _eval(getattr(transformers, model_cls), cfg)

    class CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False).logits

    return CausalLM().eval()


def causal_lm_with_past(model_cls: str, config_cls: str, **overrides):
    """A decoder step with a key/value cache: (``input_ids`` [batch, seq], ``attention_mask``
    [batch, past+seq], then per layer ``past_key_i``, ``past_value_i`` [batch, heads, past,
    head_dim]) → (``logits``, per layer ``present_key_i``, ``present_value_i``)."""
    import torch
    import transformers

    cfg = _config(config_cls, overrides)
    inner = _eval(getattr(transformers, model_cls), cfg)
    layers = cfg.num_hidden_layers if hasattr(cfg, "num_hidden_layers") else cfg.n_layer

    class WithPast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, *past):
            cache = transformers.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                             past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return WithPast().eval()


def seq2seq(model_cls: str, config_cls: str, **overrides):
    """An encoder-decoder (``input_ids``, ``attention_mask``, ``decoder_input_ids`` →
    ``last_hidden_state`` of the decoder)."""
    import torch
    import transformers

    cfg = getattr(transformers, config_cls)(**overrides)
    inner = _eval(getattr(transformers, model_cls), cfg)

    class Seq2Seq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, decoder_input_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              decoder_input_ids=decoder_input_ids,
                              use_cache=False).last_hidden_state

    return Seq2Seq().eval()


def single_input(model_cls: str, config_cls: str, output: str = "last_hidden_state",
                 submodule: str | None = None, **overrides):
    """A vision or audio model with one input (``pixel_values``, ``input_values``,
    ``input_features``) → ``output``; ``submodule`` picks e.g. a model's ``encoder``."""
    import torch
    import transformers

    cfg = getattr(transformers, config_cls)(**overrides)
    inner = _eval(getattr(transformers, model_cls), cfg)
    if submodule:
        inner = getattr(inner, submodule)

    class Single(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return getattr(self.inner(x), output)

    return Single().eval()
