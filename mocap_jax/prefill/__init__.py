"""EvaluatePrefill: one configuration's prefill timeline, memory, MBKR and metrics
(:mod:`.evaluate`), built from user-facing settings (:mod:`.points`) and batched over many
configurations (:mod:`.batch`)."""
