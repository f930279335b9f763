"""The schedule of one configuration: work items (:mod:`.items`), the timing recurrence
(:mod:`.recurrence`), KV release and memory resolved in time (:mod:`.memory`), and the static
structure of a bucket (:mod:`.shape`)."""
