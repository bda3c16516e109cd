"""How the Gloo test jobs in this folder leave: imported by their scripts, this folder being
sys.path[0] when one runs (by the interpreter, or by launch's warm template)."""
import os
import sys


def exit_without_finalizing(code):
    """Leaves as os._exit does, after flushing: not through the interpreter's finalization.

    torch 2.9's Gloo worker thread lets go of a finished collective just after waking the rank's
    main thread. If main has by then returned and dropped the collective's tensors, that thread
    must take the GIL to free them; taken while the interpreter finalizes, the thread is unwound
    inside a noexcept destructor and the process aborts after its work is done ("terminate called
    without an active exception", SIGABRT; a few runs in a hundred under CI's load;
    pytorch/pytorch#190489, #179291). No ordering of Python code closes that window, since the
    thread may be descheduled for as long as the scheduler likes; not finalizing does.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
