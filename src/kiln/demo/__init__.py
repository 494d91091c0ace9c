"""``kiln demo``: compile a real model and check it against onnxruntime on rendered input.

Lives here: the text-orientation demo (:mod:`kiln.demo.orientation`), its page renderer
(:mod:`kiln.demo.page`) and its preprocessing (:mod:`kiln.demo.preprocess`). Needs Pillow and
onnxruntime (the ``demo`` extra); may import all of ``kiln``.
"""
