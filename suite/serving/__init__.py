"""A small LLM serving engine for the serving techniques: request traces (:mod:`.traces`), KV-cache
bookkeeping (:mod:`.blocks`), the engine with its schedulers and KV layouts (:mod:`.engine`) and
what the techniques share (:mod:`.bench`)."""
