"""MBKR, memory-balanced KV reallocation: pairing and routes (:mod:`.pairing`), the spill rule
and its event programs (:mod:`.spills`), what spills cost (:mod:`.costs`), and the stage-to-die
placement that keeps pairs and pipeline neighbours close (:mod:`.placement`)."""
