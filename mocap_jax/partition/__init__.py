"""Planners that cut a batch of prefill requests into pipelined work items: how many tokens each
chunk (slice) covers and, for TeraPipe's planner (:mod:`.terapipe`), how the batch's requests are
split into groups that are sliced on their own and run back to back.  Each planner works on cost
tables built by one vectorised program (seconds of the bottleneck stage for every slice a plan may
use), solves its objective exactly on them, and returns plain host values (request counts, token
counts, seconds) together with the item table the simulator runs.
"""
