"""Answers launch's question on a hang: torch's flight recorder of this process (its last
collectives: sequence number, operation, sizes, process group), read in-process.

Why in-process: torch 2.9.1 records Gloo's collectives (TORCH_FR_BUFFER_SIZE) but offers no way
to ask a Gloo process for them from outside. NCCL's pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) is
read by ProcessGroupNCCL's heartbeat monitor only, and the control plane's handler
(dump_nccl_trace_json, served only where the program itself wraps its main in
torch.distributed.elastic.control_plane.worker_main) dumps NCCL's recorder, which is empty for
Gloo. docs/user-guide.md ("Hangs") has the details.

launch names a socket in DDPL_FLIGHT_RECORDER_SOCKET, in the rank's private log folder, and
sets TORCH_FR_BUFFER_SIZE unless the user did. The first ddplaunch.step() (or done()) starts
one daemon thread that listens there; it sleeps in accept() until launch asks, so it costs no
CPU time. Each connection gets one JSON object and is closed:
    {"pid": P, "fr": <torch's Gloo/CPU dump or null>, "nccl": <NCCL's dump or null>,
     "error": "<why a dump is missing, or empty>"}
The thread needs the GIL to answer: a rank waiting in a collective, a sleep, a lock or a queue
answers; one stopped (SIGSTOP) or stuck in native code that holds the GIL does not, and launch
falls back on its stack.
"""
import os
import socket
import sys
import threading

_ENV = "DDPL_FLIGHT_RECORDER_SOCKET"
_started = False


def start():
    """Serve the dump where launch asked for it; nothing without launch. Once per process."""
    global _started
    if _started:
        return
    _started = True
    path = os.environ.get(_ENV)
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        # Never unlinks first: a path in use is the rank's own server, and this process is one
        # of its children that inherited the variable (a spawned helper calling ddplaunch).
        sock.bind(path)
        sock.listen(4)
    except OSError:
        sock.close()
        return
    pid = os.getpid()
    threading.Thread(target=_serve, args=(sock, pid), name="ddplaunch-flight-recorder",
                     daemon=True).start()
    import atexit

    atexit.register(_remove, path, pid)


def _remove(path, pid):
    if os.getpid() == pid:
        try:
            os.unlink(path)
        except OSError:
            pass


def _serve(sock, pid):
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)  # launch reads at once; never wait on a reader that went away
            try:
                conn.sendall(_answer(pid))
            except OSError:
                pass


def _answer(pid):
    fr = nccl = b"null"
    error = ""
    # Not imported here: a program that never loaded torch.distributed has no recorder, and
    # importing torch from this thread would take seconds and change the process.
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if c10d is None:
        error = "torch.distributed is not loaded"
    else:
        try:
            fr = bytes(c10d._dump_fr_trace_json(True, False))
        except Exception as e:  # an older or newer torch: say why, launch uses the stacks
            error = f"_dump_fr_trace_json: {type(e).__name__}: {e}"
        dump_nccl = getattr(c10d, "_dump_nccl_trace_json", None)  # builds with NCCL only
        if dump_nccl is not None:
            try:
                nccl = bytes(dump_nccl(True, False))
            except Exception:
                pass
    import json

    return b'{"pid":%d,"fr":%s,"nccl":%s,"error":%s}' % (pid, fr, nccl,
                                                          json.dumps(error).encode())
