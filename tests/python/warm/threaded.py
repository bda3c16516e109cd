"""A module that starts a thread when imported: a template that imports it must not fork."""
import threading
import time

threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
