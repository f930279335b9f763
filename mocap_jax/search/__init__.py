"""Searches shared by every layer: simulated annealing over many chains (:mod:`.anneal`)."""
