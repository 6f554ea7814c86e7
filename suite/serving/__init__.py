"""Layer 3, the library (with :mod:`gpubench.lib` and :mod:`gpubench.models`): may import lib,
models, measure, records, the contract and errors; never a technique, run, gate, reports or cli.

A small LLM serving engine for the serving techniques, after nano-vllm's split: request traces
(:mod:`.traces`), sequences (:mod:`.sequence`), KV bookkeeping (:mod:`.blocks`) and storage
(:mod:`.kv`), the schedulers (:mod:`.scheduler`), the model runner (:mod:`.model_runner`), the
loop (:mod:`.engine`), serving metrics (:mod:`.metrics`), lone generation as the reference
(:mod:`.reference`) and what the two techniques share (:mod:`.bench`)."""
