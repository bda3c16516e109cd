"""An uncaught exception two frames deep: the traceback must read as after a cold start."""


def inner():
    raise RuntimeError("boom from inner")


def outer():
    inner()


outer()
