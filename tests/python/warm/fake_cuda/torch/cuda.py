def is_initialized():
    return True
