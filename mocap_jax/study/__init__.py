"""Studies built on the simulator: the scheme comparison (:mod:`.compare`), the MOCAP study on
embedded defaults (:mod:`.reproduce`), and the claims ledger against the MOCAP paper (:mod:`.claims`)."""
