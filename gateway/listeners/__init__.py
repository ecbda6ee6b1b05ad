"""One module per protocol listener; each defines ``LISTENER``."""
