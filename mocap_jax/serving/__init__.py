"""The serving model: arrivals (:mod:`.arrivals`) and end-to-end latency under FCFS batching (:mod:`.e2e`)."""
