# The warm template (docs/warm-restarts.md): a Python interpreter that has imported the modules
# named by --prewarm and started no thread, from which launch's Python workers are forked instead
# of started cold. launch embeds this file in its binary (launcher/warm/CMakeLists.txt) and runs
#   PYTHON -u -c 'exec(...)' MODULES...
# with the control socket on descriptor 3, its output on a log file, its own process group and
# PR_SET_PDEATHSIG. It never writes to the console and never installs a signal handler.
#
# The protocol (launcher/warm/worker_template.cc): SOCK_SEQPACKET, one JSON object a message.
#   template -> launch   {"ready": true, "pid": P} or {"ready": false, "why": "..."}
#   launch -> template   {"argv": [...], "env": {...}, "cpus": [...], "fds": ["stdout", ...]}
#                        with those descriptors attached (SCM_RIGHTS)
#   template -> launch   {"pid": WORKER} or {"error": "..."}
# A worker is forked twice (template -> intermediate -> worker) and the intermediate exits at
# once, so the worker is reparented to launch (a child subreaper): launch waits for it, and sees
# its exit status, as for a worker it forked itself.
import json
import os
import socket
import sys
import threading

_CONTROL_FD = 3
_MAX_MESSAGE = 8 << 20  # launch refuses larger requests before sending (EMSGSIZE)
_FILE = "<ddplaunch warm template>"
# What a module loads only at first use, and every training program of it uses: torch's compiler
# stack (over 800 modules, 1.3 s here) is imported by DistributedDataParallel's constructor and by
# torch.compile. Importing it in the template is what makes a DDP worker's restart warm.
_LAZY = {"torch": ("torch._dynamo",)}


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _unsafe_reason(modules):
    """Why forking this interpreter would not give a worker what a cold start gives, or None."""
    n = _threads()
    if n > 1 and threading.active_count() == 1:
        # Native pools that stop in their own pthread_atfork handler (OpenBLAS's, started by
        # numpy's import unless OMP_NUM_THREADS=1) are safe to fork: a trial fork stops them,
        # and they start again at their next use. Threads still running after it are not.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        n = _threads()
    if n > 1 or threading.active_count() > 1:
        what = ("a Python thread" if threading.active_count() > 1
                else "native threads that a fork does not stop")
        return (f"the template has {n} threads after importing {', '.join(modules)} ({what}); "
                "forking a process with threads is unsafe")
    if _cuda_driver_initialised():
        return ("the CUDA driver was initialised while importing the modules (a call such as "
                "torch.cuda.is_available() or device_count() does it); a forked worker could "
                "not use it")
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return ("CUDA was initialised while importing the modules; a forked worker could "
                        "not use it")
        except Exception:  # a torch without CUDA support, or a broken one: nothing initialised
            pass
    return None


def _cuda_driver_initialised():
    """Whether cuInit ran in this process. Loaded is not initialised: torch's CUDA libraries
    load libcuda at import on some builds (torch 2.11 with CUDA 13 on a lent H200 host), and a
    fork is safe until cuInit. cuCtxGetCurrent answers CUDA_ERROR_NOT_INITIALIZED (3) before it
    and initialises nothing; the library is only looked up where it is already loaded."""
    try:
        with open("/proc/self/maps") as f:
            if not any("libcuda.so" in line for line in f):
                return False
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4) | os.RTLD_LAZY)
        ctx = ctypes.c_void_p()
        return lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 3
    except OSError:
        return False  # not loaded under that name: nothing of ours initialised it


def _recv(sock):
    msg, fds, flags, _ = socket.recv_fds(sock, _MAX_MESSAGE, 16)
    if not msg:
        for fd in fds:
            os.close(fd)
        return None, []
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError("request truncated")
    return json.loads(msg), fds


def _send(sock, obj):
    sock.send(json.dumps(obj).encode())


def _set_cmdline(argv):
    """What ps and /proc/PID/cmdline show: the template's own argument area rewritten (as
    setproctitle does), cut to its length (launch pads the template's command for this)."""
    try:
        import ctypes
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        data = "\0".join(argv).encode(errors="surrogateescape")[:end - start - 1]
        ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    except Exception:
        pass  # a kernel without those fields: ps shows the template's command


def _fresh_main(**names):
    """__main__'s namespace as the interpreter leaves it before a program's first line runs."""
    import __main__
    d = __main__.__dict__
    builtins = d["__builtins__"]
    d.clear()
    d.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None,
             __annotations__={}, __builtins__=builtins, **names)
    return d


def _reseed():
    # A cold start draws fresh seeds from the OS; a fork copies the template's. Python's random
    # reseeds itself at fork (os.register_at_fork); numpy's global generator does not.
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass


class _TrimmedHook:
    """Prints the uncaught exception without the template's frames above the program's (the
    default hook prints the exception's own __traceback__, so that is trimmed too)."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, etype, value, tb):
        tb = _trim(tb)
        if isinstance(value, BaseException):
            value.__traceback__ = tb
        self.hook(etype, value, tb)


def _trim(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename in (_FILE, "<string>"):
        tb = tb.tb_next
    return tb


def _be_worker(req, fds, launch_pid, control):
    """In the worker, before its program runs: everything a cold start would have set."""
    import ctypes
    os.setpgid(0, 0)
    # The intermediate exits at once; until it has, a death signal would fire on its exit.
    import time
    parent = os.getppid()
    deadline = time.monotonic() + 10
    while parent != launch_pid and time.monotonic() < deadline:
        time.sleep(0.0002)
        parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != launch_pid:
        os._exit(127)  # launch died (or never became our parent): nothing to run for
    control.close()
    named = dict(zip(req["fds"], fds))
    # Both best-effort, as in a cold start (launch/process.cc does not stop a worker over them).
    procs = named.pop("cgroup", None)
    if procs is not None:
        try:
            os.write(procs, b"0")  # into the attempt's cgroup, before anything else can fork
        except OSError:
            pass
        os.close(procs)
    if req.get("cpus"):
        try:
            os.sched_setaffinity(0, req["cpus"])
        except OSError:
            pass
    os.dup2(named.pop("stdout"), 1)
    os.dup2(named.pop("stderr"), 2)
    env = req["env"]
    heartbeat = named.pop("heartbeat", None)
    if heartbeat is not None:
        os.set_inheritable(heartbeat, True)  # as across a cold start's exec
        env[req["heartbeat_env"]] = str(heartbeat)
    for fd in named.values():
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    _reseed()
    _set_cmdline(req["orig_argv"])


def _run(req):
    """Runs the worker's command (PYTHON -u SCRIPT|-m MODULE ...) as the interpreter would, in
    this process: returns the callable that does it."""
    argv = req["argv"]  # what follows `PYTHON -u`
    sys.orig_argv = list(req["orig_argv"])
    if argv[0] == "-m":
        import runpy
        sys.argv = ["-m"] + argv[2:]
        sys.path[0] = os.getcwd()
        _fresh_main()
        return lambda: runpy._run_module_as_main(argv[1], alter_argv=True)
    path = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    from importlib.machinery import SourceFileLoader
    main = _fresh_main(__file__=path, __cached__=None,
                       __loader__=SourceFileLoader("__main__", path))
    return lambda: exec(code, main)


def _fork_worker(req, fds, control):
    """Forks the worker through an intermediate that exits at once. True in the worker."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            worker = os.fork()
            if worker == 0:
                os.close(w)
                return True
            try:
                os.setpgid(worker, worker)  # also here: launch may signal the group at once
            except OSError:
                pass
            os.write(w, str(worker).encode())
        except BaseException:
            os._exit(1)  # the intermediate never returns into the template's loop
        os._exit(0)
    os.close(w)
    for fd in fds:
        os.close(fd)
    fds.clear()  # closed: serve()'s error path must not close the numbers again
    data = b""
    while len(data) < 32:
        chunk = os.read(r, 32)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(middle, 0)
    if not data:
        _send(control, {"error": "the intermediate process died before forking the worker"})
    else:
        _send(control, {"pid": int(data)})
    return False


_template_pid = None


def serve(modules):
    """The template's life: import, say whether it is safe, then fork workers on request.
    Returns, in a worker only, (request, descriptors, launch's pid, control socket)."""
    global _template_pid
    _template_pid = os.getpid()
    control = socket.socket(fileno=_CONTROL_FD)
    launch_pid = os.getppid()
    # torch.cuda.is_available() during an import asks NVML instead of initialising the CUDA
    # driver (which a fork could not use): torch's own switch, for the imports only.
    nvml_check = "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ
    if nvml_check:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        import importlib
        for m in modules:
            importlib.import_module(m)
            for lazy in _LAZY.get(m, ()):
                try:
                    importlib.import_module(lazy)
                except Exception:  # a torch built without it: the workers do without it too
                    pass
        why = _unsafe_reason(modules)
    except BaseException as e:  # an import that fails here would fail in every worker too
        why = f"importing the modules failed: {type(e).__name__}: {e}"
    if nvml_check:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
    if why:
        _send(control, {"ready": False, "why": why})
        # Exit only when launch has read the reason and closed the socket: an exit first would
        # reach launch as a template that died, without the reason.
        while True:
            try:
                if not control.recv(_MAX_MESSAGE):
                    return None
            except OSError:
                return None
    _set_cmdline([sys.executable, "-u", f"[ddplaunch warm template: {','.join(modules)}]"])
    _send(control, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            req, fds = _recv(control)
        except (OSError, ValueError) as e:
            _send(control, {"error": f"bad request: {e}"})
            continue
        if req is None:
            return None  # launch closed the socket: the run is over
        try:
            if _fork_worker(req, fds, control):
                return req, fds, launch_pid, control
        except Exception as e:
            if os.getpid() != _template_pid:
                os._exit(1)  # the intermediate: never serve requests
            for fd in fds:  # a request that failed before its fork: nothing keeps them
                try:
                    os.close(fd)
                except OSError:
                    pass
            _send(control, {"error": f"{type(e).__name__}: {e}"})


def main():
    got = serve(sys.argv[1:])
    if got is None:
        return
    req, fds, launch_pid, control = got
    _be_worker(req, fds, launch_pid, control)
    try:
        _run(req)()
    except SystemExit:
        raise
    except BaseException:
        # The interpreter prints it on the way out (with sys.excepthook as the program left it)
        # and exits 1, or by SIGINT for a KeyboardInterrupt, as after a cold start; only the
        # template's own frames are left out.
        sys.excepthook = _TrimmedHook(sys.excepthook)
        raise
