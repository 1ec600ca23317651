"""The transformers architectures of ``bench/bench_zoo.py``: configs and inputs, no weights.

Every model is built from a configuration with random weights (``torch.manual_seed(0)``):
nothing is downloaded. Each builder takes the sweep mode:

- ``"fp32"``: a tiny configuration (hidden 64, 4 heads, 2 layers, vocabulary 256) that keeps the
  architecture's distinguishing features (grouped-query heads, sliding windows small enough to
  bite at 16 tokens, soft-capping, ALiBi, partial rotary, experts, relative positions, ...);
  inputs are batch 2 x 16 tokens, 32 px images, 0.1 s of audio.
- ``"bf16"``: one layer at the hidden sizes of a real public checkpoint (named in the comment),
  vocabulary cut to 4096 (the embedding and the head are a cost of the vocabulary, not of the
  layer), batch 1 x 32 tokens, 224 px images, 1 s of audio.

A builder returns ``(model, kwargs)``; the driver casts the model and the floating inputs to
the mode's dtype. Encoders get an ``attention_mask`` with padding (the second sequence's last
five tokens masked). Decoders are built with the attention implementation the row names
(``eager``, ``sdpa``, ``flex_attention``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

VOCAB = {"fp32": 256, "bf16": 4096}
SEQ = {"fp32": (2, 16), "bf16": (1, 32)}


def _t():
    import transformers
    return transformers


def _ids(mode: str, vocab: int | None = None, pad: bool = False) -> dict:
    b, s = SEQ[mode]
    g = torch.Generator().manual_seed(1)
    out = {"input_ids": torch.randint(3, vocab or VOCAB[mode], (b, s), generator=g)}
    if pad:
        mask = torch.ones(b, s, dtype=torch.long)
        mask[-1, s - 5:] = 0            # the last sequence is padded (with one row: its tail)
        out["attention_mask"] = mask
    return out


def _pixels(mode: str, size_fp32: int = 32, size_bf16: int = 224, channels: int = 3) -> torch.Tensor:
    b = SEQ[mode][0]
    size = size_fp32 if mode == "fp32" else size_bf16
    return torch.randn(b, channels, size, size, generator=torch.Generator().manual_seed(2))


# ----------------------------------------------------------------------------------- decoders
_TINY_DEC = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                 num_hidden_layers=2, max_position_embeddings=128, head_dim=16)
_TOK = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
# transformers offers no sdpa attention for these: their default rows run eager attention.
NO_SDPA = {"Gemma2ForCausalLM", "BloomForCausalLM"}


def _decoder(cls: str, cfg_cls: str, tiny: dict, real: dict, drop: tuple = ()):
    """A builder for a causal LM: ``tiny`` overrides the shared tiny config, ``real`` the
    one-layer real-shape config; ``drop`` names shared keys this config does not take."""
    def build(mode: str, attn: str, cache: bool = True) -> tuple[torch.nn.Module, dict]:
        T = _t()
        base = {k: v for k, v in _TINY_DEC.items() if k not in drop} if mode == "fp32" else {}
        kw = {**base, **(tiny if mode == "fp32" else real), **_TOK}
        kw.setdefault("vocab_size", VOCAB[mode])
        if mode == "bf16":
            kw.setdefault("num_hidden_layers", 1)
        cfg = getattr(T, cfg_cls)(**kw)
        cfg._attn_implementation = "eager" if attn == "sdpa" and cls in NO_SDPA else attn
        torch.manual_seed(0)
        model = getattr(T, cls)(cfg)
        inputs = _ids(mode, kw["vocab_size"])
        if not cache:
            inputs["use_cache"] = False
        return model, inputs
    return build


def _gpt_style(cls: str, cfg_cls: str, tiny: dict, real: dict):
    """Decoders whose configs use their own key names (no shared tiny keys)."""
    return _decoder(cls, cfg_cls, tiny, real, drop=tuple(_TINY_DEC))


DECODERS: dict[str, tuple[Callable, str]] = {
    # name: (builder, what it exercises)
    "llama": (_decoder("LlamaForCausalLM", "LlamaConfig", {}, dict(   # Llama-3.2-1B
        hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
        head_dim=64, rope_theta=500000.0)), "RoPE, GQA 4/2"),
    "mistral": (_decoder("MistralForCausalLM", "MistralConfig", dict(sliding_window=8), dict(
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        head_dim=128, sliding_window=16)), "sliding window 8 < 16 tokens, GQA"),   # Mistral-7B
    "qwen2": (_decoder("Qwen2ForCausalLM", "Qwen2Config", {}, dict(   # Qwen2-0.5B
        hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864)),
        "qkv bias, GQA"),
    "qwen3": (_decoder("Qwen3ForCausalLM", "Qwen3Config", {}, dict(   # Qwen3-0.6B
        hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, intermediate_size=3072,
        head_dim=128)), "q/k RMSNorm, GQA"),
    "gemma": (_decoder("GemmaForCausalLM", "GemmaConfig", dict(num_key_value_heads=1), dict(
        hidden_size=2048, num_attention_heads=8, num_key_value_heads=1, intermediate_size=16384,
        head_dim=256)), "MQA, GeLU-tanh gate, scaled embeddings"),   # gemma-2b
    "gemma2": (_decoder("Gemma2ForCausalLM", "Gemma2Config", dict(
        sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0), dict(
        hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, intermediate_size=9216,
        head_dim=256, sliding_window=16, num_hidden_layers=2)),
        "logit soft-capping, alternating sliding window (eager: no sdpa)"),   # gemma-2-2b (2 layers: both kinds)
    "gemma3": (_decoder("Gemma3ForCausalLM", "Gemma3TextConfig", dict(sliding_window=8), dict(
        hidden_size=1152, num_attention_heads=4, num_key_value_heads=1, intermediate_size=6912,
        head_dim=256, sliding_window=16)), "q/k norm, local/global layers, MQA"),  # gemma-3-1b
    "phi": (_decoder("PhiForCausalLM", "PhiConfig", dict(partial_rotary_factor=0.5), dict(
        hidden_size=2048, num_attention_heads=32, intermediate_size=8192,
        partial_rotary_factor=0.5), drop=("head_dim", "num_key_value_heads")),
        "partial rotary 0.5, parallel block"),   # phi-1_5
    "phi3": (_decoder("Phi3ForCausalLM", "Phi3Config", {}, dict(   # Phi-3-mini
        hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, intermediate_size=8192),
        drop=("head_dim",)), "fused qkv / gate-up"),
    "falcon": (_gpt_style("FalconForCausalLM", "FalconConfig", dict(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=2, alibi=True, multi_query=True,
        new_decoder_architecture=False, parallel_attn=True), dict(   # falcon-7b
        hidden_size=4544, num_attention_heads=71, num_hidden_layers=1, alibi=False,
        multi_query=True, new_decoder_architecture=False, parallel_attn=True)),
        "ALiBi + MQA (tiny), rotary MQA (real)"),
    "bloom": (_gpt_style("BloomForCausalLM", "BloomConfig", dict(   # bloom-560m
        hidden_size=64, n_head=4, n_layer=2), dict(hidden_size=1024, n_head=16, n_layer=1)),
        "ALiBi (eager: no sdpa)"),
    "gpt_neox": (_gpt_style("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(   # pythia-160m
        hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
        rotary_pct=0.25), dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=1,
        intermediate_size=3072, rotary_pct=0.25)), "partial rotary 0.25 (Pythia)"),
    "gptj": (_gpt_style("GPTJForCausalLM", "GPTJConfig", dict(   # gpt-j-6b
        n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=128), dict(
        n_embd=4096, n_head=16, n_layer=1, rotary_dim=64, n_positions=2048)),
        "interleaved partial rotary"),
    "opt": (_gpt_style("OPTForCausalLM", "OPTConfig", dict(   # opt-125m
        hidden_size=64, num_attention_heads=4, num_hidden_layers=2, ffn_dim=128,
        word_embed_proj_dim=64), dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=1,
        ffn_dim=3072, word_embed_proj_dim=768)), "learned positions"),
    "gpt2": (_gpt_style("GPT2LMHeadModel", "GPT2Config", dict(   # gpt2 (124M)
        n_embd=64, n_head=4, n_layer=2, n_positions=128), dict(n_embd=768, n_head=12, n_layer=1)),
        "Conv1D projections"),
    "starcoder2": (_decoder("Starcoder2ForCausalLM", "Starcoder2Config", dict(sliding_window=8),
        dict(hidden_size=3072, num_attention_heads=24, num_key_value_heads=2,   # starcoder2-3b
             intermediate_size=12288, sliding_window=16), drop=("head_dim",)),
        "sliding window, GQA 24/2, LayerNorm"),
    "mixtral": (_decoder("MixtralForCausalLM", "MixtralConfig", dict(
        num_local_experts=4, num_experts_per_tok=2), dict(   # Mixtral-8x7B, 2 of its 8 experts
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        head_dim=128, num_local_experts=2, num_experts_per_tok=2)), "MoE top-2"),
    "qwen2_moe": (_decoder("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=128), dict(   # Qwen1.5-MoE-A2.7B, 8 of its 60 experts
        hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, intermediate_size=5632,
        num_experts=8, num_experts_per_tok=4, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632), drop=("head_dim",)), "MoE top-2 + shared expert"),
}

# Rows of the other attention implementations (fp32 only): the default rows above use sdpa
# and the model's default ``use_cache`` (the returned cache is not compared). ``@nocache`` rows
# pass ``use_cache=False``, which takes transformers' packed-sequence check on position ids.
EAGER_ATTENTION = [n for n in DECODERS if n not in ("gemma2", "bloom")]
FLEX_ATTENTION = ["llama", "qwen2"]
NO_CACHE = ["llama", "gpt2"]


def _mamba(mode: str) -> tuple[torch.nn.Module, dict]:
    T = _t()
    kw = (dict(hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)
          if mode == "fp32" else   # mamba-130m
          dict(hidden_size=768, state_size=16, num_hidden_layers=1, expand=2, conv_kernel=4))
    torch.manual_seed(0)
    model = T.MambaForCausalLM(T.MambaConfig(vocab_size=VOCAB[mode], **kw, **_TOK))
    return model, _ids(mode)


# ----------------------------------------------------------------------------------- encoders
def _encoder(cls: str, cfg_cls: str, tiny: dict, real: dict):
    def build(mode: str) -> tuple[torch.nn.Module, dict]:
        T = _t()
        kw = dict(tiny if mode == "fp32" else real)
        kw.setdefault("vocab_size", VOCAB[mode])
        torch.manual_seed(0)
        model = getattr(T, cls)(getattr(T, cfg_cls)(**kw))
        return model, _ids(mode, kw["vocab_size"], pad=True)
    return build


_TINY_ENC = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
                 max_position_embeddings=64)
_BASE_ENC = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                 num_hidden_layers=1)

ENCODERS: dict[str, tuple[Callable, str]] = {
    "bert": (_encoder("BertModel", "BertConfig", _TINY_ENC, _BASE_ENC), "padding mask"),
    "roberta": (_encoder("RobertaModel", "RobertaConfig", _TINY_ENC, _BASE_ENC),
                "padding mask, position ids from the mask"),
    "electra": (_encoder("ElectraModel", "ElectraConfig", {**_TINY_ENC, "embedding_size": 32},
                         {**_BASE_ENC, "embedding_size": 768}), "padding mask, embedding projection"),
    "distilbert": (_encoder("DistilBertModel", "DistilBertConfig", dict(
        dim=64, n_heads=4, hidden_dim=128, n_layers=2, max_position_embeddings=64), dict(
        dim=768, n_heads=12, hidden_dim=3072, n_layers=1)), "padding mask"),
    "albert": (_encoder("AlbertModel", "AlbertConfig", {**_TINY_ENC, "embedding_size": 32}, {
        **_BASE_ENC, "embedding_size": 128}), "shared layers, factorised embedding, padding mask"),
    "deberta_v2": (_encoder("DebertaV2Model", "DebertaV2Config", {
        **_TINY_ENC, "relative_attention": True, "position_buckets": 8, "max_relative_positions": 16,
        "pos_att_type": ["p2c", "c2p"]}, {   # deberta-v3-base
        **_BASE_ENC, "relative_attention": True, "position_buckets": 256,
        "pos_att_type": ["p2c", "c2p"]}), "disentangled relative attention, padding mask"),
}


# ---------------------------------------------------------------------------- encoder-decoders
def _seq2seq(cls: str, cfg_cls: str, tiny: dict, real: dict):
    def build(mode: str) -> tuple[torch.nn.Module, dict]:
        T = _t()
        kw = {**(tiny if mode == "fp32" else real), "vocab_size": VOCAB[mode], **_TOK,
              "decoder_start_token_id": 0}
        torch.manual_seed(0)
        model = getattr(T, cls)(getattr(T, cfg_cls)(**kw))
        inputs = _ids(mode, pad=True)
        b, s = SEQ[mode]
        inputs["decoder_input_ids"] = torch.randint(
            3, VOCAB[mode], (b, s // 2), generator=torch.Generator().manual_seed(3))
        inputs["use_cache"] = False
        return model, inputs
    return build


_TINY_BART = dict(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  max_position_embeddings=64)


def _real_bart(d: int, heads: int, ffn: int) -> dict:
    return dict(d_model=d, encoder_layers=1, decoder_layers=1, encoder_attention_heads=heads,
                decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn)


SEQ2SEQ: dict[str, tuple[Callable, str]] = {
    "t5": (_seq2seq("T5ForConditionalGeneration", "T5Config", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=1, num_decoder_layers=1, num_heads=4,
        relative_attention_num_buckets=8), dict(   # t5-small
        d_model=512, d_kv=64, d_ff=2048, num_layers=1, num_decoder_layers=1, num_heads=8)),
        "relative position buckets, cross-attention"),
    "bart": (_seq2seq("BartForConditionalGeneration", "BartConfig", _TINY_BART,
                      _real_bart(768, 12, 3072)), "learned positions, cross-attention"),  # bart-base
    "marian": (_seq2seq("MarianMTModel", "MarianConfig", _TINY_BART,
                        _real_bart(512, 8, 2048)), "sinusoidal positions"),   # opus-mt-en-de
    "pegasus": (_seq2seq("PegasusForConditionalGeneration", "PegasusConfig", _TINY_BART,
                         _real_bart(1024, 16, 4096)), "pre-norm, sinusoidal"),  # pegasus-large
}


# ------------------------------------------------------------------------ vision, audio, towers
_TINY_VIT = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
                 image_size=32, patch_size=8)
_BASE_VIT = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                 num_hidden_layers=1, image_size=224, patch_size=16)


def _vit(cls: str, cfg_cls: str):
    def build(mode: str) -> tuple[torch.nn.Module, dict]:
        T = _t()
        torch.manual_seed(0)
        cfg = getattr(T, cfg_cls)(**(_TINY_VIT if mode == "fp32" else _BASE_VIT))
        return getattr(T, cls)(cfg), {"pixel_values": _pixels(mode)}
    return build


def _swin(mode: str) -> tuple[torch.nn.Module, dict]:
    T = _t()
    kw = (dict(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
               window_size=4) if mode == "fp32" else   # swin-tiny, one block per stage
          dict(image_size=224, patch_size=4, embed_dim=96, depths=[1, 1, 1, 1],
               num_heads=[3, 6, 12, 24], window_size=7))
    torch.manual_seed(0)
    return T.SwinModel(T.SwinConfig(**kw)), {"pixel_values": _pixels(mode)}


def _two_tower(prefix: str, tiny_vision: dict, real_vision: dict):
    """CLIPModel / SiglipModel: text and vision towers and their similarity logits."""
    def build(mode: str) -> tuple[torch.nn.Module, dict]:
        T = _t()
        if mode == "fp32":
            text = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                        num_hidden_layers=2, max_position_embeddings=16, vocab_size=VOCAB[mode])
            vision = dict(tiny_vision)
        else:
            text = dict(hidden_size=512 if prefix == "CLIP" else 768, num_hidden_layers=1,
                        num_attention_heads=8 if prefix == "CLIP" else 12,
                        intermediate_size=2048 if prefix == "CLIP" else 3072,
                        max_position_embeddings=32, vocab_size=VOCAB[mode])
            vision = dict(real_vision)
        cfg = getattr(T, f"{prefix}Config")(
            text_config=getattr(T, f"{prefix}TextConfig")(**text, **_TOK),
            vision_config=getattr(T, f"{prefix}VisionConfig")(**vision))
        torch.manual_seed(0)
        model = getattr(T, f"{prefix}Model")(cfg)
        b, s = SEQ[mode]
        ids = _ids(mode, pad=prefix == "CLIP")
        return model, {**ids, "pixel_values": _pixels(mode, vision["image_size"],
                                                       vision["image_size"])}
    return build


def _wav2vec2(mode: str) -> tuple[torch.nn.Module, dict]:
    T = _t()
    if mode == "fp32":
        kw = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2,
                  conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                  num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        samples = 1600
    else:   # wav2vec2-base, one transformer layer, 1 s at 16 kHz
        kw = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                  num_hidden_layers=1)
        samples = 16000
    torch.manual_seed(0)
    model = T.Wav2Vec2Model(T.Wav2Vec2Config(**kw))
    b = SEQ[mode][0]
    return model, {"input_values": torch.randn(b, samples, generator=torch.Generator().manual_seed(4))}


class _WhisperEncoder(torch.nn.Module):
    """The encoder of a WhisperModel (the audio tower), returning its hidden states."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_features):
        return self.encoder(input_features).last_hidden_state


def _whisper(mode: str) -> tuple[torch.nn.Module, dict]:
    T = _t()
    if mode == "fp32":
        kw = dict(d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  num_mel_bins=16, max_source_positions=16, max_target_positions=16)
    else:   # whisper-base: 512 wide, 80 mel bins, 30 s window (3000 frames -> 1500 positions)
        kw = dict(d_model=512, encoder_layers=1, decoder_layers=1, encoder_attention_heads=8,
                  decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                  num_mel_bins=80, max_source_positions=1500)
    torch.manual_seed(0)
    model = _WhisperEncoder(T.WhisperModel(T.WhisperConfig(
        vocab_size=VOCAB[mode], decoder_start_token_id=1, **_TOK, **kw)))
    frames = 2 * kw["max_source_positions"]
    b = SEQ[mode][0]
    return model, {"input_features": torch.randn(b, kw["num_mel_bins"], frames,
                                                 generator=torch.Generator().manual_seed(5))}


OTHERS: dict[str, tuple[Callable, str, str]] = {
    # name: (builder, family, what it exercises)
    "mamba": (_mamba, "decoder", "selective state space (sequential scan)"),
    "vit": (_vit("ViTModel", "ViTConfig"), "vision", "patch embedding conv, CLS token"),
    "deit": (_vit("DeiTModel", "DeiTConfig"), "vision", "CLS + distillation tokens"),
    "swin": (_swin, "vision", "shifted windows, relative position bias, patch merging"),
    "clip": (_two_tower("CLIP", dict(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     num_hidden_layers=2, image_size=32, patch_size=8),
                        dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                             num_hidden_layers=1, image_size=224, patch_size=32)),
             "two-tower", "CLIPModel: causal text tower with padding, vision tower, logits"),
    "siglip": (_two_tower("Siglip", dict(hidden_size=64, num_attention_heads=4,
                                         intermediate_size=128, num_hidden_layers=2,
                                         image_size=32, patch_size=8),
                          dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                               num_hidden_layers=1, image_size=224, patch_size=16)),
               "two-tower", "SiglipModel: attention-pooling head, sigmoid logits"),
    "wav2vec2": (_wav2vec2, "audio", "conv feature encoder, group norm, conv positions"),
    "whisper_encoder": (_whisper, "audio", "conv stem on log-mel frames, sinusoidal positions"),
}
