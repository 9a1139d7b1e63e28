"""How Q, K or V can be made: plain Python, no torch (module.py builds them)."""

MODES = ("projected", "identity", "identity_init", "residual")  # how Q, K or V is made (the table above)
LEARNED_MODES = ("projected", "residual")  # the modes with a trained W that low rank can factor (W = B A)
