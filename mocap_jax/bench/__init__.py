"""Benchmarks (commands, not tests): each measures one product path and prints what it measured --
points, configuration, devices and the host (:func:`.machine.host`) -- with compile time apart.
The README quotes the figures measured with the exact commands shown there."""
