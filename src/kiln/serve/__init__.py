"""``kiln serve``: an OpenAI-compatible HTTP server for a compiled decoder, with continuous
batching.

- :mod:`kiln.serve.batch`: the rows of the running batch's shared key/value cache.
- :mod:`kiln.serve.scheduler`: the engine thread that steps the decoder over that batch,
  admitting requests between steps and dropping finished or cancelled ones.
- :mod:`kiln.serve.text`: token ids to streamed text, with OpenAI's ``stop`` strings.
- :mod:`kiln.serve.protocol`: request validation and OpenAI's reply and error shapes.
- :mod:`kiln.serve.app`: the ASGI application (starlette) and the routes.
- :mod:`kiln.serve.server`: uvicorn around the application, in the foreground or a thread.
- :mod:`kiln.serve.model`: the served model (decoder, tokenizer, context length).

Needs the ``serve`` extra (starlette, uvicorn); :mod:`batch`, :mod:`scheduler` and
:mod:`text` need only numpy.

May import: kiln.llm, kiln.models, kiln.runtime, kiln.vm (and kiln.errors).
"""
