"""What the FastAPI and aiohttp integrations share, free of either framework: the
idempotency rule (:mod:`.idempotency`), the mapping of errors to problem bodies
(:mod:`.problems`) and the JSON of the read-only workflow routes (:mod:`.views`)."""
