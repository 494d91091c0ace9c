"""``kiln demo``: compile real models and check them against onnxruntime on real input.

Lives here: the text-orientation demo (:mod:`kiln.demo.orientation`, with its page renderer
:mod:`kiln.demo.page` and preprocessing :mod:`kiln.demo.preprocess`), the sentence-embedding
demo (:mod:`kiln.demo.embed`, with the WordPiece tokenizer :mod:`kiln.demo.wordpiece`), the OCR
demo (:mod:`kiln.demo.ocr`, with :mod:`kiln.demo.ocr_pipeline`), and what they share
(:mod:`kiln.demo.common`). Needs Pillow and onnxruntime (the ``demo`` extra);

May import: anything in kiln.
"""
